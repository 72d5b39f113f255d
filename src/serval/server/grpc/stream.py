"""One gRPC call on one HTTP/2 stream: request messages in, reply messages and status out.

The connection feeds it the stream's DATA; it splits length-prefixed messages (inflating gzip or
deflate ones), and queues reply frames that the connection sends as flow control allows.
"""

from __future__ import annotations

import asyncio
import struct
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from serval.http2 import frames as h2
from serval.http2.hpack import Header, encode_headers

if TYPE_CHECKING:
    from serval.server.grpc.connection import GrpcConnection

_MESSAGE_PREFIX = struct.Struct(">BL")
_RESPONSE_HEADERS = b"\x88" + encode_headers([("content-type", "application/grpc")])
_PERCENT_SAFE = frozenset(range(0x20, 0x7F)) - {ord("%")}

# gRPC status codes used by the transport itself
OK, CANCELLED, INTERNAL, UNIMPLEMENTED, RESOURCE_EXHAUSTED = 0, 1, 13, 12, 8


class CallFailed(Exception):
    """The request cannot be read (size, compression); the call ends with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass(eq=False)
class ServerCall:
    """One HTTP/2 stream carrying one gRPC call."""

    connection: GrpcConnection
    stream_id: int
    headers: list[Header]
    path: str = ""
    received_ns: int = 0
    send_window: int = 0
    messages: deque[bytes] = field(default_factory=deque)
    remote_closed: bool = False
    finished: bool = False
    task: asyncio.Task[None] | None = None
    _buffer: bytearray = field(default_factory=bytearray)
    _waiter: asyncio.Future[None] | None = None
    _headers_sent: bool = False
    _pending: deque[bytes] = field(default_factory=deque)
    _trailers: bytes | None = None
    _unacked_bytes: int = 0

    # reading ---------------------------------------------------------------------------------

    def metadata(self) -> list[Header]:
        """Custom metadata: every header that is not a pseudo-header."""
        return [(name, value) for name, value in self.headers if not name.startswith(":")]

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def read(self) -> bytes | None:
        """The next request message; None once the client has finished sending."""
        while not self.messages:
            if self.remote_closed:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self.messages.popleft()

    def _feed(self, data: bytes) -> None:
        """Split received bytes into length-prefixed gRPC messages."""
        buffer = self._buffer
        if not buffer and len(data) >= 5 and _MESSAGE_PREFIX.unpack_from(data)[1] == len(data) - 5:
            self._deliver(data[0], data[5:])  # the usual case: one whole message in one frame
            return
        buffer += data
        while len(buffer) >= 5:
            compressed, length = _MESSAGE_PREFIX.unpack_from(buffer)
            self._check_size(length)
            if len(buffer) < 5 + length:
                return
            message = bytes(buffer[5:5 + length])
            del buffer[:5 + length]
            self._deliver(compressed, message)

    def _check_size(self, length: int) -> None:
        limit = self.connection.max_message_bytes
        if length > limit:
            raise CallFailed(RESOURCE_EXHAUSTED,
                             f"received message larger than max ({length} vs. {limit})")

    def _deliver(self, compressed: int, message: bytes) -> None:
        self._check_size(len(message))
        if compressed:
            message = _decompress(message, self.header("grpc-encoding") or "identity",
                                  self.connection.max_message_bytes)
        self.messages.append(message)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # writing ---------------------------------------------------------------------------------

    def send_message(self, payload: bytes) -> None:
        if self.finished:
            return
        if not self._headers_sent:
            self._headers_sent = True
            self.connection.write(h2.frame(h2.HEADERS, h2.END_HEADERS, self.stream_id,
                                           _RESPONSE_HEADERS))
        self._pending.append(_MESSAGE_PREFIX.pack(0, len(payload)) + payload)
        self.connection.send_pending(self)

    def finish(self, status: int, message: str = "") -> None:
        """End the call with a status (trailers; trailers-only when nothing was sent)."""
        if self.finished:
            return
        self.finished = True
        trailers = [("grpc-status", str(status))]
        if message:
            trailers.append(("grpc-message", percent_encode(message)))
        if self._headers_sent:
            self._trailers = h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, self.stream_id,
                                      encode_headers(trailers))
        else:
            self._trailers = h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, self.stream_id,
                                      _RESPONSE_HEADERS + encode_headers(trailers))
        self.connection.send_pending(self)

    def _take_sendable(self, connection_window: int,
                       max_frame_bytes: int) -> tuple[list[bytes], int]:
        """DATA frames (then trailers) that the flow-control windows allow now, and their size."""
        out: list[bytes] = []
        window = connection_window
        pending = self._pending
        while pending:
            allowed = min(self.send_window, window, max_frame_bytes)
            if allowed <= 0:
                return out, connection_window - window
            chunk = pending[0]
            if len(chunk) <= allowed:
                pending.popleft()
            else:
                pending[0] = chunk[allowed:]
                chunk = chunk[:allowed]
            self.send_window -= len(chunk)
            window -= len(chunk)
            out.append(h2.frame(h2.DATA, 0, self.stream_id, chunk))
        if self._trailers is not None:
            out.append(self._trailers)
            self._trailers = None
        return out, connection_window - window


def _decompress(message: bytes, encoding: str, limit_bytes: int) -> bytes:
    if encoding not in ("gzip", "deflate"):
        raise CallFailed(UNIMPLEMENTED, f"compressed message with unsupported grpc-encoding "
                                        f"'{encoding}' (supported: gzip, deflate)")
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        plain = inflater.decompress(message, limit_bytes + 1)
    except zlib.error as exc:
        raise CallFailed(INTERNAL, f"cannot decompress the {encoding} message: {exc}") from None
    if len(plain) > limit_bytes:
        raise CallFailed(RESOURCE_EXHAUSTED, f"decompressed message larger than max "
                                             f"({limit_bytes} bytes)")
    return plain


def percent_encode(message: str) -> str:
    """grpc-message encoding: printable ASCII except '%' as is, every other byte as %XX."""
    raw = message.encode("utf-8")
    if all(byte in _PERCENT_SAFE for byte in raw):
        return message
    return "".join(chr(b) if b in _PERCENT_SAFE else f"%{b:02X}" for b in raw)
