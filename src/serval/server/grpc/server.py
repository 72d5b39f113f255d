"""The gRPC server: Serval's own HTTP/2 connections (h2c, or h2 over TLS) on the event loop."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from serval.auth import TokenStore
from serval.dataplane import DataPlane
from serval.server.grpc.calls import ServiceRunner
from serval.server.grpc.connection import GrpcConnection
from serval.server.grpc.health import HealthServicer
from serval.server.grpc.servicer import InferenceServicer
from serval.server.grpc.stream import ResponseHeaders
from serval.server.limits import TransportGuards
from serval.server.listen import serve_on, tls_context


class GrpcServer:
    """Listening for gRPC; `stop` refuses new calls and lets the open ones finish."""

    def __init__(self, server: asyncio.Server, connections: set[GrpcConnection],
                 health: HealthServicer) -> None:
        self.server, self.connections, self.health = server, connections, health

    @property
    def port(self) -> int:
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self, grace_s: float) -> None:
        self.server.close()
        self.health.stopping.set()  # open health Watches say NOT_SERVING and end
        for connection in list(self.connections):
            connection.shut_down()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            connection.abort()


async def start_grpc_server(dataplane: DataPlane, sock: socket.socket, *,
                            guards: TransportGuards,
                            auth: TokenStore | None = None,
                            tls: tuple[Path, Path] | None = None,
                            own_headers: tuple[tuple[str, str], ...] = ()) -> GrpcServer:
    """A started server on a bound socket. `own_headers` (serval-node) go on every answer,
    encoded here once."""
    health = HealthServicer(dataplane)
    runner = ServiceRunner(InferenceServicer(dataplane, auth), health)
    headers = ResponseHeaders(own_headers)
    connections: set[GrpcConnection] = set()
    cert, key = tls if tls is not None else (None, None)
    server = await serve_on(sock, lambda: GrpcConnection(runner, connections, guards, headers),
                            tls_context(cert, key, alpn=("h2",)),
                            guards.limits.tls_handshake_timeout_s, guards.gate)
    return GrpcServer(server, connections, health)
