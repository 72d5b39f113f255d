"""A closed gRPC connection is freed by reference counting alone (no reference cycles): what it
buffered does not wait for a full GC pass."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Coroutine
from typing import Any

import pytest
import uvloop

from serval.config import TransportLimits
from serval.http2 import frames as h2
from serval.server.grpc.connection import GrpcConnection
from serval.server.grpc.stream import ServerCall
from serval.server.limits import TransportGuards
from tests.security.h2_helpers import data, headers, message, request_block


class _Runner:
    """Unary methods: "Echo" answers at once, "Slow" waits until cancelled."""

    def __init__(self) -> None:
        self.calls: list[weakref.ref[ServerCall]] = []

    def is_client_streaming(self, path: str) -> bool | None:
        return path.endswith("Stream") if "/inference." in path else None

    def run(self, call: ServerCall) -> Coroutine[Any, Any, None]:
        self.calls.append(weakref.ref(call))
        return self._run(call)

    async def _run(self, call: ServerCall) -> None:
        try:
            if call.path.endswith("Slow"):
                await asyncio.sleep(60)
            while call.path.endswith("Stream") and await call.read() is not None:
                call.send_message(b"echo")
            call.send_message(b"echo")
            call.finish(0)
        except asyncio.CancelledError:
            call.finish(1, "cancelled")
            raise


async def _scenario(reset_by_client: bool) -> tuple[list[weakref.ref[Any]], int]:
    runner = _Runner()
    connections: set[GrpcConnection] = set()
    guards = TransportGuards.build(TransportLimits(max_connections=16))
    server = await asyncio.get_running_loop().create_server(
        lambda: GrpcConnection(runner, connections, guards), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = message(b"request")
    writer.write(h2.PREFACE + h2.settings_frame({})
                 + headers(1, end_stream=False) + data(1, body, True)  # answered
                 + headers(3, request_block("Slow")) + data(3, body, True)  # running at close
                 + headers(5, request_block("Stream")) + data(5, body)  # streaming, open
                 + headers(7, request_block("Slow")) + data(7, body, True)
                 + h2.rst_stream(7, h2.CANCEL)  # reset in the same read
                 + headers(9, request_block(content_type="text/plain"), True)  # 415
                 + h2.frame(h2.PING, 0, 0, b"\x00" * 8))
    received = b""
    while received.count(b"echo") < 2:  # stream 1's answer and stream 5's first one
        chunk = await asyncio.wait_for(reader.read(65536), 5)
        assert chunk, f"closed: {received!r}"
        received += chunk
    refs: list[weakref.ref[Any]] = [weakref.ref(c) for c in connections]
    refs += runner.calls
    if reset_by_client:
        writer.transport.abort()
    else:
        writer.write(h2.frame(h2.DATA, 0, 1, b"\x00" * 9))  # DATA after END_STREAM is fine..
        writer.write(h2.window_update(0, 0))  # ..a zero WINDOW_UPDATE is a connection error
        await reader.read()
        writer.close()
    for _ in range(100):
        if not connections:
            break
        await asyncio.sleep(0.01)
    for _ in range(5):
        await asyncio.sleep(0)  # let the cancelled calls finish
    server.close()
    await server.wait_closed()
    return refs, len(connections)


@pytest.mark.parametrize("reset_by_client", [True, False])
def test_a_closed_connection_is_freed_without_gc(reset_by_client: bool) -> None:
    gc.collect()
    gc.disable()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            refs, still_open = runner.run(_scenario(reset_by_client))
        assert still_open == 0
        alive = [ref() for ref in refs if ref() is not None]
        assert not alive, f"kept alive by reference cycles: {alive}"
    finally:
        gc.enable()
