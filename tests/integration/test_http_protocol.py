"""HTTP/1.1 behaviour of the server itself: keep-alive, pipelining, 100-continue, bad framing."""

from __future__ import annotations

import gzip
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call

pytestmark = pytest.mark.integration

BODY = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8],
                                 "data": [0.5] * 8}]})


def _request(body: bytes = BODY, extra: str = "") -> bytes:
    return (f"POST /v2/models/linear/infer HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}"
            f"\r\n{extra}\r\n").encode() + body


def _read_responses(sock: socket.socket, count: int) -> list[bytes]:
    data, responses = b"", []
    while len(responses) < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        while b"\r\n\r\n" in data:
            head, rest = data.split(b"\r\n\r\n", 1)
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(rest) < length:
                break
            responses.append(head + b"\r\n\r\n" + rest[:length])
            data = rest[length:]
    return responses


def _connect(server: RunningServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def test_pipelined_requests_are_answered_in_order(server: RunningServer) -> None:
    bodies = [orjson.dumps({"id": str(i), "inputs": [{"name": "x", "datatype": "FP32",
                                                      "shape": [1, 8], "data": [i] * 8}]})
              for i in range(5)]
    with _connect(server) as sock:
        sock.sendall(b"".join(_request(body) for body in bodies))
        responses = _read_responses(sock, 5)
    ids = [orjson.loads(r.split(b"\r\n\r\n", 1)[1])["id"] for r in responses]
    assert ids == ["0", "1", "2", "3", "4"]


def test_expect_100_continue(server: RunningServer) -> None:
    with _connect(server) as sock:
        head, body = _request(extra="Expect: 100-continue\r\n").split(b"\r\n\r\n", 1)
        sock.sendall(head + b"\r\n\r\n")
        assert sock.recv(1024).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        (response,) = _read_responses(sock, 1)
    assert response.startswith(b"HTTP/1.1 200 OK")


def test_chunked_request_body(server: RunningServer) -> None:
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (BODY[:20], BODY[20:]))
    head = b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    with _connect(server) as sock:
        sock.sendall(head + chunked + b"0\r\n\r\n")
        (response,) = _read_responses(sock, 1)
    assert response.startswith(b"HTTP/1.1 200 OK")


@pytest.mark.parametrize("codings", [b"gzip, chunked", b"deflate,chunked", b"x-custom, Chunked"])
def test_a_transfer_coding_other_than_chunked_is_501(server: RunningServer,
                                                     codings: bytes) -> None:
    gzipped = gzip.compress(BODY)  # what the client says it sent: was read as plain JSON
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(gzipped), gzipped)
    head = (b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: %s\r\n"
            b"\r\n" % codings)
    with _connect(server) as sock:
        sock.sendall(head + chunked)
        (response,) = _read_responses(sock, 1)
    assert response.startswith(b"HTTP/1.1 501 Not Implemented"), response
    coding = codings.split(b",")[0].strip().lower().decode()
    assert f"Transfer-Encoding '{coding}' is not supported".encode() in response
    with _connect(server) as sock:  # chunked alone, in any case, is read as ever
        sock.sendall(head.replace(codings, b"CHUNKED") + b"%x\r\n%s\r\n0\r\n\r\n" % (
            len(BODY), BODY))
        (response,) = _read_responses(sock, 1)
    assert response.startswith(b"HTTP/1.1 200 OK")


def test_connection_close_is_honoured(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(_request(extra="Connection: close\r\n"))
        (response,) = _read_responses(sock, 1)
        assert b"connection: close" in response.lower()
        assert sock.recv(1024) == b""


def test_malformed_http_gets_400_and_the_server_keeps_serving(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"NOT A REQUEST\r\n\r\n")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400") and b"malformed HTTP request" in reply
    assert call(server.url, "GET", "/v2/health/ready").status == 200


def test_percent_encoded_paths(server: RunningServer) -> None:
    assert call(server.url, "GET", "/v2/models/%6Cinear").json()["name"] == "linear"


def test_sigterm_finishes_in_flight_requests_then_exits_zero(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    fixture_models.heavy(tmp_path, layers=40, width=512)
    server = server_factory(tmp_path)
    x = [0.1] * 512
    doc = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 512],
                                    "data": x}]})
    outcomes: list[object] = []

    def send() -> None:
        try:
            outcomes.append(call(server.url, "POST", "/v2/models/heavy/infer", doc).status)
        except ConnectionRefusedError:
            outcomes.append("refused")  # arrived after the listener closed: never accepted
        except OSError as exc:
            outcomes.append(f"lost: {exc!r}")

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    server.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(timeout=30)
    assert server.process.wait(timeout=30) == 0
    assert len(outcomes) == 8 and 200 in outcomes
    assert all(outcome in (200, "refused") for outcome in outcomes), outcomes


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to read the backlog")
def test_both_listeners_keep_a_deep_accept_backlog(server: RunningServer) -> None:
    """A burst of thousands of clients must wait in the kernel's queue, not be left half-open."""
    for port in (server.port, server.grpc_port):
        listing = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True,
                                 text=True, check=True).stdout.split()
        assert listing[0] == "LISTEN" and int(listing[2]) >= 4096, listing  # Send-Q: backlog


def test_a_client_that_half_closes_gets_every_pipelined_answer(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(_request() * 3)
        sock.shutdown(socket.SHUT_WR)
        responses = _read_responses(sock, 4)
    assert len(responses) == 3 and all(r.startswith(b"HTTP/1.1 200") for r in responses)


def test_an_upgrade_request_is_answered_as_http_1_1_then_closed(server: RunningServer) -> None:
    with _connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\n"
                     b"Upgrade: h2c\r\n\r\nGET /v2/health/live HTTP/1.1\r\n\r\n")
        responses = _read_responses(sock, 2)
        assert sock.recv(1024) == b""
    assert len(responses) == 1 and responses[0].startswith(b"HTTP/1.1 200")
    assert b"connection: close" in responses[0]

