"""A closed HTTP/1.1 connection is freed by reference counting alone: no cycle keeps what it
buffered until a GC pass (parser <-> callbacks, timer, task, transport)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace

import pytest

from serval.auth import ANONYMOUS, Token
from serval.config import TransportLimits
from serval.server.http.errors import Reply
from serval.server.http.infer_headers import RawHeaders
from serval.server.http.protocol import ConnectionTracker, HttpProtocol
from serval.server.limits import TransportGuards

Client = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
LIMITS = TransportLimits(max_connections=16, header_timeout_s=0.3, body_timeout_s=0.3,
                         keepalive_timeout_s=0.3, max_request_bytes=1000)


class _App:
    """The two calls HttpProtocol makes of HttpApp."""

    async def handle(self, method: str, path: str, headers: RawHeaders, body: bytes,
                     query: str = "", authorized: Token | None = None) -> Reply:
        await asyncio.sleep(0)
        return 200, b"{}", [(b"content-type", b"application/json")]

    def precheck(self, method: str, path: str, headers: RawHeaders) -> Reply | Token:
        return (401, b"{}", []) if path == "/secret" else ANONYMOUS


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _closed_connection_is_freed(client: Client, limits: TransportLimits = LIMITS) -> None:
    guards = TransportGuards.build(limits)
    tracker = ConnectionTracker()
    made: list[weakref.ref[HttpProtocol]] = []

    def factory() -> HttpProtocol:
        protocol = HttpProtocol(_App(), tracker, guards)  # type: ignore[arg-type]
        made.append(weakref.ref(protocol))
        return protocol

    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await client(reader, writer)
    writer.close()
    for _ in range(200):  # the server sees the close and drops the connection
        if made and not tracker.connections and made[0]() is None:
            break
        await asyncio.sleep(0.01)
    server.close()
    await server.wait_closed()
    assert made, "no connection was made"
    assert not tracker.connections and guards.budget.held_bytes == 0
    assert made[0]() is None, "a closed connection is still referenced: " + repr(
        [type(r).__name__ for r in gc.get_referrers(made[0]())])


async def _keepalive_requests(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    for _ in range(3):
        writer.write(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n")
        assert (await reader.readuntil(b"{}")).startswith(b"HTTP/1.1 200")


async def _malformed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n\x00garbage\r\n\r\n")
    assert b"HTTP/1.1 400" in await reader.read()


async def _refused_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n" + b"x" * 500)
    assert (await reader.read()).startswith(b"HTTP/1.1 413")


async def _unauthorized(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"POST /secret HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n")
    assert (await reader.read()).startswith(b"HTTP/1.1 401")


async def _gone_mid_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n"
                 b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 900\r\n\r\nxx")
    await reader.readuntil(b"{}")


async def _timed_out(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"GET /a HTTP/1.1\r\nHost: t\r\nX-Slow: ")
    assert (await reader.read()).startswith(b"HTTP/1.1 408")


async def _never_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.transport.pause_reading()
    writer.write(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n" * 20_000)
    await asyncio.sleep(0.8)  # paused writing on the server: reading stops, then the stall


@pytest.mark.parametrize("client", [_keepalive_requests, _malformed, _refused_body,
                                    _unauthorized, _gone_mid_body, _timed_out])
def test_a_closed_connection_is_freed_without_the_cycle_collector(
        client: Client, no_gc: None) -> None:
    asyncio.run(_closed_connection_is_freed(client))


def test_a_connection_closed_for_a_write_stall_is_freed(no_gc: None) -> None:
    limits = replace(LIMITS, write_buffer_bytes=4096)
    asyncio.run(_closed_connection_is_freed(_never_read, limits))
