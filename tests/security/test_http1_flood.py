"""HTTP/1.1 write backpressure: a client that pipelines without reading is not read either."""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import replace

import pytest

from serval.auth import ANONYMOUS, Token
from serval.config import TransportLimits
from serval.server.http.errors import Reply
from serval.server.http.infer_headers import RawHeaders
from serval.server.http.protocol import ConnectionTracker, HttpProtocol
from serval.server.limits import TransportGuards
from tests.conftest import RunningServer
from tests.integration.http_helpers import metric
from tests.security.conftest import connect, watch
from tests.security.http1_helpers import Factory, assert_log_quiet, short_server

REQUESTS = 200_000
STALLS = 'serval_connections_closed_total{reason="write stall"}'


@pytest.fixture(scope="module")
def short(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    return short_server(server_factory, tmp_path_factory.mktemp("http1-flood"))


@pytest.mark.integration
def test_200k_pipelined_gets_from_a_client_that_never_reads(short: RunningServer) -> None:
    flood = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n" * REQUESTS
    stalls_before = metric(short.url, STALLS, missing=0)
    with watch(short) as result, connect(short.port) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # and never reads
        # How many answers fill the kernel's buffers before the server sees the stall depends
        # on the box's speed; the bound that matters is the close it makes, checked below.
        sock.settimeout(60.0)
        started = time.monotonic()
        reset = False
        try:
            sock.sendall(flood)  # blocks once the server stops reading
            while time.monotonic() - started < 60:  # the flood fit in the socket buffers
                sock.sendall(flood[:41])
                time.sleep(0.01)
        except (ConnectionResetError, BrokenPipeError):
            reset = True  # the server gave up on a client that reads nothing (write stall)
        except TimeoutError:
            pass
        closed_s = time.monotonic() - started
    assert reset, ("the server neither read all 200,000 requests nor closed the connection in "
                   f"{closed_s:.0f} s; its log ends:\n" + "\n".join(short.log().splitlines()[-10:]))
    # written answers paused reading; after --body-timeout-s (1 s) of no progress: closed
    assert metric(short.url, STALLS) == stalls_before + 1
    result.assert_held()
    assert_log_quiet(short)
    print(f"pipelined flood: RSS +{result.growth_mib:.0f} MiB, closed in {closed_s:.2f} s, "
          f"good clients {[round(c.worst_s, 3) for c in result.clients]} s")


@pytest.mark.integration
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


class _HeldApp:
    """Answers nothing until released, so requests pile up behind the first."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def handle(self, method: str, path: str, headers: RawHeaders, body: bytes,
                     query: str = "", authorized: Token | None = None) -> Reply:
        await self.release.wait()
        return 200, path.encode(), []

    def precheck(self, method: str, path: str, headers: RawHeaders) -> Reply | Token:
        return ANONYMOUS


def test_parsing_stops_at_the_read_ahead_limit_and_resumes_in_order() -> None:
    count, pipelined = 20_000, 8

    async def run() -> None:
        app, made = _HeldApp(), []
        guards = TransportGuards.build(replace(TransportLimits(max_connections=4),
                                               max_pipelined=pipelined))

        def factory() -> HttpProtocol:
            made.append(HttpProtocol(app, ConnectionTracker(), guards))  # type: ignore[arg-type]
            return made[-1]

        server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.sockets[0].getsockname()[1])
        writer.write(b"".join(b"GET /%d HTTP/1.1\r\nHost: t\r\n\r\n" % i for i in range(count)))
        await asyncio.sleep(0.3)
        (protocol,) = made
        assert protocol.reading_paused and protocol.unparsed is not None
        assert len(protocol.pending) <= pipelined + 16 * 1024 // 20  # one 16 KiB slice
        app.release.set()
        received = b""
        while received.count(b"HTTP/1.1 200") < count:
            received += await asyncio.wait_for(reader.read(1 << 20), 10)
        paths = [int(part.split(b"\r\n\r\n", 1)[1][1:] or b"-1")
                 for part in received.split(b"HTTP/1.1 200 OK")[1:]]
        assert paths == list(range(count))
        writer.close()
        server.close()

    asyncio.run(run())
