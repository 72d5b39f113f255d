"""HTTP/1.1 write backpressure: a client that pipelines without reading is not read either."""

from __future__ import annotations

import socket
import time

import pytest

from tests.conftest import RunningServer
from tests.security.conftest import connect, watch
from tests.security.http1_helpers import Factory, assert_log_quiet, short_server

pytestmark = pytest.mark.integration
REQUESTS = 200_000


@pytest.fixture(scope="module")
def short(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    return short_server(server_factory, tmp_path_factory.mktemp("http1-flood"))


def test_200k_pipelined_gets_from_a_client_that_never_reads(short: RunningServer) -> None:
    flood = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n" * REQUESTS
    with watch(short) as result, connect(short.port) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never reads
        sock.settimeout(10.0)
        started = time.monotonic()
        reset = False
        try:
            sock.sendall(flood)  # blocks once the server stops reading
            while time.monotonic() - started < 10:  # the flood fit in the socket buffers
                sock.sendall(flood[:41])
                time.sleep(0.01)
        except (ConnectionResetError, BrokenPipeError):
            reset = True  # the server gave up on a client that reads nothing (write stall)
        closed_s = time.monotonic() - started
    assert reset, "the server read all 200,000 requests of a client that reads nothing"
    # written answers pause reading; after --body-timeout-s (1 s) of no progress: closed
    assert closed_s < 5.0
    result.assert_held()
    assert_log_quiet(short)
    print(f"pipelined flood: RSS +{result.growth_mib:.0f} MiB, closed in {closed_s:.2f} s, "
          f"good clients {[round(c.worst_s, 3) for c in result.clients]} s")


def test_a_pipelining_client_that_reads_gets_every_answer_in_order(
        short: RunningServer) -> None:
    count = 5_000
    requests = b"".join(b"GET /v2/models/linear/ready?i=%d HTTP/1.1\r\nHost: t\r\n\r\n" % i
                        for i in range(count))
    with connect(short.port) as sock:
        sock.sendall(requests)
        received = b""
        deadline = time.monotonic() + 20
        while received.count(b"HTTP/1.1 200") < count:
            assert time.monotonic() < deadline
            received += sock.recv(1 << 20)
    assert received.count(b'"ready":true') == count
