"""Builds the grpc.aio server: message limits, keepalive that suits long-lived channels."""

from __future__ import annotations

from pathlib import Path

import grpc

from serval.auth import TokenStore
from serval.dataplane import DataPlane
from serval.server.grpc.proto import grpc_service_pb2_grpc as pb_grpc
from serval.server.grpc.servicer import InferenceServicer


def grpc_options(max_message_bytes: int, reuse_port: bool) -> list[tuple[str, int]]:
    """Channel arguments: big tensors allowed, idle clients pinged, eager pingers tolerated."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_pings_without_data", 0),
    ]


async def start_grpc_server(dataplane: DataPlane, host: str, port: int, *,
                            max_message_bytes: int, reuse_port: bool,
                            auth: TokenStore | None = None,
                            tls: tuple[Path, Path] | None = None) -> grpc.aio.Server:
    """A started server on host:port; OSError when the port cannot be bound."""
    server = grpc.aio.server(options=grpc_options(max_message_bytes, reuse_port))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(dataplane, auth),
                                                       server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        if tls is None:
            bound = server.add_insecure_port(address)
        else:
            cert, key = tls
            credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise OSError(f"cannot listen for gRPC on {address}: {exc}") from None
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {address}")
    await server.start()
    return server
