"""HTTP/1.1 sizes and order: headers, request targets and bodies refused before they are held,
and every answer, errors included, sent in request order."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import RunningServer
from tests.security.conftest import closed_within, connect, watch
from tests.security.http1_helpers import (
    BODY,
    Factory,
    read_until,
    send_until_refused,
    short_server,
    statuses,
)

pytestmark = pytest.mark.integration
MIB = 1024 * 1024


def _infer(body: bytes = BODY, length: int | None = None) -> bytes:
    return (b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n"
            % (len(body) if length is None else length)) + body


@pytest.fixture(scope="module")
def small(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    """Short timeouts and a 10 KiB body limit."""
    return short_server(server_factory, tmp_path_factory.mktemp("http1-limits"),
                        "--max-request-mb", "0.01")


def test_a_300_mib_header_value_is_refused_after_64_kib(small: RunningServer) -> None:
    with watch(small) as result, connect(small.port) as sock:
        sent: list[int] = []
        sender = threading.Thread(target=lambda: sent.append(send_until_refused(
            sock, b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\nX-Big: ", b"a", 300 * MIB)))
        started = time.monotonic()
        sender.start()
        answer = closed_within(sock, 10.0)
        closed_s = time.monotonic() - started
        sender.join(timeout=10)
    assert statuses(answer) == [431] and b"--max-header-bytes" in answer
    result.assert_held()
    print(f"huge header: sent {sent[0] / MIB:.0f} MiB, RSS +{result.growth_mib:.0f} MiB, "
          f"closed in {closed_s:.2f} s, good clients "
          f"{[round(c.worst_s, 3) for c in result.clients]} s")


def test_many_small_headers_are_refused_by_count_and_by_bytes(small: RunningServer) -> None:
    with watch(small) as result:
        with connect(small.port) as sock:  # 64 MiB of tiny headers: the count stops it
            started = time.monotonic()
            send_until_refused(sock, b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n",
                               b"X-A: b\r\n", 64 * MIB)
            answer = closed_within(sock, 10.0)
            closed_s = time.monotonic() - started
        assert statuses(answer) == [431] and b"more than 100 header fields" in answer
        with connect(small.port) as sock:  # fewer, longer headers: the byte count stops it
            headers = b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(90))
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n" + headers + b"\r\n")
            answer = closed_within(sock, 10.0)
        assert statuses(answer) == [431] and b"65536 bytes" in answer
    result.assert_held()
    print(f"64 MiB of small headers: RSS +{result.growth_mib:.0f} MiB, sent and closed in "
          f"{closed_s:.2f} s, good clients {[round(c.worst_s, 3) for c in result.clients]} s")


def test_a_long_request_target_gets_414(small: RunningServer) -> None:
    with watch(small) as result, connect(small.port) as sock:
        started = time.monotonic()
        send_until_refused(sock, b"GET /", b"a", 16 * MIB)
        answer = closed_within(sock, 10.0)
        closed_s = time.monotonic() - started
    assert statuses(answer) == [414] and b"--max-url-bytes" in answer
    result.assert_held()
    print(f"16 MiB URL: RSS +{result.growth_mib:.0f} MiB, sent and closed in {closed_s:.2f} s, "
          f"good clients {[round(c.worst_s, 3) for c in result.clients]} s")


def test_a_valid_request_then_garbage_answers_both_in_order(small: RunningServer) -> None:
    with connect(small.port) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: t\r\n\r\n" + _infer()
                     + b"\x00\x01 NOT HTTP\r\n\r\n")
        answer = closed_within(sock, 10.0)
    assert statuses(answer) == [200, 200, 400]
    assert b"malformed HTTP request" in answer


def test_a_pipelined_413_waits_for_the_answer_before_it(small: RunningServer) -> None:
    with connect(small.port) as sock:
        sock.sendall(_infer() + _infer(length=50_000))
        answer = closed_within(sock, 10.0)
    assert statuses(answer) == [200, 413]
    assert answer.index(b'"outputs"') < answer.index(b"--max-request-mb")


def test_errors_of_every_kind_keep_request_order(small: RunningServer) -> None:
    for second, status in ((b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414),
                           (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 101 + b"\r\n", 431)):
        with connect(small.port) as sock:
            sock.sendall(_infer() + second)
            answer = closed_within(sock, 10.0)
        assert statuses(answer) == [200, status]


def test_100_continue_waits_for_the_size_check(small: RunningServer) -> None:
    with connect(small.port) as sock:  # too large: 413 at once, no 100
        sock.sendall(b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: t\r\n"
                     b"Content-Length: 50000\r\nExpect: 100-continue\r\n\r\n")
        answer = closed_within(sock, 10.0)
    assert statuses(answer) == [413]
    with connect(small.port) as sock:  # fits: 100, then the answer
        head, body = _infer().split(b"\r\n\r\n", 1)
        sock.sendall(head + b"\r\nExpect: 100-continue\r\n\r\n")
        assert statuses(read_until(sock, lambda got: b"\r\n\r\n" in got)) == [100]
        sock.sendall(body)
        assert statuses(read_until(sock, lambda got: b'"outputs"' in got)) == [200]
