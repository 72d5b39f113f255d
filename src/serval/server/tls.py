"""TLS connections counted by the connection gate from their accept, not their handshake's end.

asyncio's `create_server(ssl=...)` calls a protocol's `connection_made` only once the handshake
completes, so connections still handshaking would be invisible to the `ConnectionGate`: 20,000
clients that open TLS connections and never finish could hold every descriptor for the
handshake timeout. Here each accepted socket is a `TlsHandshake` first: admitted by the gate at
once (idle, so the first to make room), upgraded with `loop.start_tls`, then handed to the
transport's own protocol, which admits itself as any connection does.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import cast

from serval.server.limits import ConnectionGate


class TlsHandshake(asyncio.Protocol):
    """One accepted TLS connection until its handshake is done; then the real protocol's."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], context: ssl.SSLContext,
                 timeout_s: float, gate: ConnectionGate) -> None:
        self._factory = factory
        self._context = context
        self._timeout_s = timeout_s
        self._gate = gate
        self._transport: asyncio.Transport | None = None
        self._hello: list[bytes] = []  # raw bytes read before start_tls took over
        self._tls_started = False
        self._task: asyncio.Task[None] | None = None
        self._received: list[bytes] = []  # what arrived between the handshake and the handover
        self._eof = False
        self._lost = False

    # the gate --------------------------------------------------------------------------------

    def is_idle(self) -> bool:
        return True  # no request yet: the first to make room for a new connection

    def evict(self) -> None:
        self._lost = True
        if self._transport is not None:
            self._transport.abort()

    # the plain connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = plain = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        if not self._gate.admit(self):
            plain.abort()
            return
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._handshake(plain))
        # uvloop reads before start_tls takes the socket over: what arrives until then (the
        # ClientHello) is kept and handed to the TLS layer right after start_tls's own set-up
        # callbacks, in the same loop turn, so no later byte can overtake it.
        loop.call_soon(loop.call_soon, self._hand_over_hello)

    def _hand_over_hello(self) -> None:
        hello, self._hello = b"".join(self._hello), []
        self._tls_started = True
        if hello and self._transport is not None and not self._transport.is_closing():
            _deliver(self._transport.get_protocol(), hello)

    async def _handshake(self, transport: asyncio.Transport) -> None:
        try:
            secure = await asyncio.get_running_loop().start_tls(
                transport, self, self._context, server_side=True,
                ssl_handshake_timeout=self._timeout_s)
        except (TimeoutError, OSError, ssl.SSLError, ConnectionError, RuntimeError):
            self._gate.release(self)
            transport.abort()
            return
        self._gate.release(self)
        if self._lost or secure is None or secure.is_closing():  # evicted or gone meanwhile
            transport.abort()
            return
        protocol = self._factory()
        secure.set_protocol(protocol)
        protocol.connection_made(secure)
        for chunk in self._received:
            protocol.data_received(chunk)
        self._received.clear()
        if self._eof and not protocol.eof_received():
            secure.close()

    # what the transport delivers before the handover ---------------------------------

    def data_received(self, data: bytes) -> None:
        if not self._tls_started:  # raw, before start_tls: the ClientHello
            self._hello.append(data)
        else:  # decrypted, between the handshake and the handover
            self._received.append(data)

    def eof_received(self) -> bool:
        self._eof = True
        return True  # keep the transport open until the real protocol decides

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._gate.release(self)


def _deliver(protocol: asyncio.BaseProtocol, data: bytes) -> None:
    """Hand bytes to a protocol as its transport would (uvloop's SSLProtocol is buffered)."""
    if isinstance(protocol, asyncio.Protocol):
        protocol.data_received(data)
        return
    buffered = cast(asyncio.BufferedProtocol, protocol)
    view = memoryview(data)
    while view:
        buffer = memoryview(buffered.get_buffer(len(view)))
        size = min(len(buffer), len(view))
        buffer[:size] = view[:size]
        buffered.buffer_updated(size)
        view = view[size:]
