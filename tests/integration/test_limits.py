"""Who may change the repository (load/unload off unless enabled) and how big a request may be."""

from __future__ import annotations

import gzip
import http.client
import socket
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call, infer

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]
LOAD = "/v2/repository/models/linear/load"
UNLOAD = "/v2/repository/models/linear/unload"


def _rows(count: int) -> dict[str, object]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [count, 8],
                        "data": [0.5] * (8 * count)}]}


@pytest.fixture(scope="module")
def limited(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("limited")
    fixture_models.linear(root)
    return server_factory(root, "--max-request-mb", "0.01", "--max-tensor-elements", "16")


def test_repository_api_is_off_by_default_with_a_way_to_enable_it(
        limited: RunningServer) -> None:
    for path in (LOAD, UNLOAD):
        reply = call(limited.url, "POST", path)
        assert reply.status == 403
        assert "disabled" in reply.error and "--repository-api" in reply.error
    assert call(limited.url, "POST", "/v2/repository/index").status == 200  # reading stays
    assert infer(limited.url, "linear", _rows(1)).status == 200  # unload did nothing
    client = triton_grpc.InferenceServerClient(limited.grpc_url)
    with pytest.raises(InferenceServerException, match=r"PERMISSION_DENIED.*--model-control"):
        client.load_model("linear")
    with pytest.raises(InferenceServerException, match="PERMISSION_DENIED"):
        client.unload_model("linear")
    assert client.is_model_ready("linear")


def test_explicit_control_can_still_switch_the_api_off(server_factory: Factory,
                                                       tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    server = server_factory(tmp_path, "--model-control", "lazy", "--no-repository-api")
    assert call(server.url, "POST", LOAD).status == 403
    assert infer(server.url, "linear", _rows(1)).status == 200  # lazy loading still works


def test_a_body_over_the_limit_gets_413_before_it_is_read(limited: RunningServer) -> None:
    big = orjson.dumps(_rows(400))  # ~13 KB > 10 KiB
    reply = infer(limited.url, "linear", big)
    assert reply.status == 413
    assert "larger than this server's limit of 10485 bytes" in reply.error
    assert "--max-request-mb" in reply.error
    assert infer(limited.url, "linear", _rows(2)).status == 200


def test_a_chunked_body_over_the_limit_gets_413(limited: RunningServer) -> None:
    host, port = limited.url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    chunks = (b"x" * 4096 for _ in range(8))
    connection.request("POST", "/v2/models/linear/infer", body=chunks,
                       encode_chunked=True)
    response = connection.getresponse()
    assert response.status == 413 and b"--max-request-mb" in response.read()
    connection.close()


def test_a_compressed_body_is_limited_once_inflated(limited: RunningServer) -> None:
    bomb = gzip.compress(b" " * 5_000_000)  # 5 MB of whitespace in ~5 KB
    assert len(bomb) < 10_000
    reply = call(limited.url, "POST", "/v2/models/linear/infer", bomb,
                 {"Content-Encoding": "gzip"})
    assert reply.status == 413 and "inflates to more than" in reply.error
    small = gzip.compress(orjson.dumps(_rows(1)))
    reply = call(limited.url, "POST", "/v2/models/linear/infer", small,
                 {"Content-Encoding": "gzip"})
    assert reply.status == 200


def test_a_tensor_over_the_element_limit_gets_400(limited: RunningServer) -> None:
    reply = infer(limited.url, "linear", _rows(3))  # 24 elements > 16
    assert reply.status == 400
    assert "input 'x' has 24 elements" in reply.error and "at most 16" in reply.error
    assert infer(limited.url, "linear", _rows(2)).status == 200  # 16: at the limit


def test_an_oversized_content_length_is_refused_without_sending_the_body(
        limited: RunningServer) -> None:
    host, port = limited.url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: 999999999\r\n\r\n")
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413") and b"999999999 bytes" in answer


def test_chunked_bodies_within_the_limit_pipelined_and_split_anywhere_are_read(
        limited: RunningServer) -> None:
    body = orjson.dumps(_rows(2))
    chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (
        20, body[:20], len(body) - 20, body[20:])
    request = (b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: x\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
    stream = request * 3
    host, port = limited.url.split(":")
    for step in (1, 5, len(request) - 1, len(stream)):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for start in range(0, len(stream), step):
                sock.sendall(stream[start:start + step])
            answers = b""
            while answers.count(b"HTTP/1.1 200 OK") < 3:
                data = sock.recv(65536)
                assert data, answers
                answers += data
        assert b"HTTP/1.1 4" not in answers

