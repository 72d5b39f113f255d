"""Listening sockets for both transports: a deep kernel queue, accepts taken in small batches,
and the one server TLS context builder."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable, Sequence
from pathlib import Path

from serval.server.limits import ConnectionGate
from serval.server.tls import TlsHandshake

# Connections the kernel may hold for accept(). create_server re-listens with its own backlog
# (100 by default), so it must be given this too: a burst of clients beyond the backlog is
# otherwise left half-open, its requests unread for seconds.
LISTEN_BACKLOG = 4096
# Connections accepted per event-loop turn: a flood of new connections is taken in small
# batches between the requests of the connections already open, not 4,096 at a time.
ACCEPT_BATCH = 64


def bind_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A listening TCP socket; SO_REUSEPORT lets worker processes share the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


async def serve_on(sock: socket.socket, factory: Callable[[], asyncio.Protocol],
                   tls: ssl.SSLContext | None, handshake_timeout_s: float,
                   gate: ConnectionGate) -> asyncio.Server:
    """Serve connections from sock: ACCEPT_BATCH accepts a turn, LISTEN_BACKLOG queued; with
    TLS, each connection counts against the gate from its accept (see server/tls.py)."""
    accept = factory
    if tls is not None:
        def accept() -> asyncio.Protocol:
            return TlsHandshake(factory, tls, handshake_timeout_s, gate)
    server = await asyncio.get_running_loop().create_server(
        accept, sock=sock, backlog=ACCEPT_BATCH)
    sock.listen(LISTEN_BACKLOG)  # asyncio listened with the batch size: the kernel's queue
    return server


def tls_context(cert: Path | None, key: Path | None,
                alpn: Sequence[str] = ()) -> ssl.SSLContext | None:
    """A server-side TLS context for cert and key (None unless both are given), offering the
    `alpn` protocols in the handshake (none: no ALPN)."""
    if cert is None or key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if alpn:
        context.set_alpn_protocols(list(alpn))
    return context


def linger(transport: asyncio.Transport, seconds: float) -> asyncio.TimerHandle | None:
    """Close once the peer had time to read our last bytes: stop writing (FIN), keep reading
    (the caller drops what comes) for `seconds`, then close, or abort if they are still unsent.
    Closing with the peer's data unread would send it a reset that can destroy those bytes (a
    GOAWAY saying why) before it reads them. None: the transport cannot half-close (TLS) and
    is closed now."""
    if not transport.can_write_eof():
        transport.close()
        return None
    transport.write_eof()
    transport.resume_reading()

    def end() -> None:
        if transport.get_write_buffer_size():
            transport.abort()
        else:
            transport.close()

    return asyncio.get_running_loop().call_later(seconds, end)
