"""The load generator's own ceiling: how fast it drives a trivial endpoint on this machine.

A trivial keep-alive HTTP server (uvloop + httptools, a fixed 2-byte JSON answer) runs in a
forked process; the closed-loop generator drives it with the same processes as the real test.
Whatever rate it reaches is the most this generator can measure here.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import socket
import time
from typing import Any, cast

import httptools

from serval.loadtest.closed_loop import run_closed_loop
from serval.loadtest.http_client import encode_http_request

RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
            b"\r\n{}")


class TrivialProtocol(asyncio.Protocol):
    """Answers every keep-alive HTTP/1.1 request with RESPONSE, nothing else."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.parser = httptools.HttpRequestParser(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_complete(self) -> None:
        self.transport.write(RESPONSE)
        if not self.parser.should_keep_alive():
            self.transport.close()


def _serve(sock: socket.socket) -> None:
    import uvloop

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(TrivialProtocol, sock=sock,
                                                                backlog=4096)
        async with server:
            await server.serve_forever()

    uvloop.run(serve())


def measure_ceiling(processes: int = 1, concurrency: int = 64, duration_s: float = 1.0,
                    warmup_s: float = 0.3) -> float:
    """Requests per second the generator reaches against a trivial endpoint (forked server)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    port = int(sock.getsockname()[1])
    context: Any = multiprocessing.get_context("fork")
    server = context.Process(target=_serve, args=(sock,), daemon=True)
    server.start()
    sock.close()
    try:
        time.sleep(0.2)
        request = encode_http_request("POST", "/v2/models/trivial/infer", b"{}")
        result = run_closed_loop("127.0.0.1", port, [request], concurrency, duration_s,
                                 warmup_s, processes=processes)
        return result.throughput_rps
    finally:
        server.kill()
        with contextlib.suppress(Exception):
            server.join(timeout=5)
