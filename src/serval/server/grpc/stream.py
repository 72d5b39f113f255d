"""One gRPC call on one HTTP/2 stream: request messages in, reply messages and status out.

The connection feeds it the stream's DATA; it splits length-prefixed messages (inflating gzip or
deflate ones), and queues reply frames that the connection sends as flow control allows.

What it holds is bounded: at most `max_messages` unread messages, and every received byte it
holds (its header list, a message being assembled, messages not yet read) counts against the
server-wide receive budget until it is read or the call ends. A message that arrives whole in
one frame is credited back to the client's windows only when the call reads it; one that
arrives in pieces must fit the budget when its length is announced, takes its bytes from the
budget as they arrive (a client that announces 64 MiB and sends 5 bytes holds 5 bytes), and is
credited as it is buffered. `progress_at` is when the call last received anything: the
connection resets a request that stalls (connection.py).
"""

from __future__ import annotations

import asyncio
import struct
import zlib
from collections import deque
from typing import Protocol

from serval.http2 import frames as h2
from serval.http2.flow import InboundWindow
from serval.http2.hpack import Header, encode_headers
from serval.protocol.grpc.status import GrpcStatus
from serval.server.limits import ReceiveBudget

_MESSAGE_PREFIX = struct.Struct(">BL")
_STATUS_200 = b"\x88"  # HPACK static table entry 8, `:status: 200`
_PERCENT_SAFE = frozenset(range(0x20, 0x7F)) - {ord("%")}
_OK_TRAILERS = encode_headers([("grpc-status", str(int(GrpcStatus.OK)))])
_DRAIN_BYTES = 256 * 1024  # unsent reply bytes above which a streaming call waits
ACCEPT_ENCODING = "identity,deflate,gzip"  # what a request's messages may be compressed with



class CallFailed(Exception):
    """The request cannot be read (size, compression); the call ends with this status (and
    `extra` trailers)."""

    def __init__(self, status: GrpcStatus, message: str,
                 extra: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


class ResponseHeaders:
    """A server's answer header blocks, HPACK-encoded once as it starts (table-free literals,
    so one block serves every connection): a call's first HEADERS (`:status` 200, content-type
    and the server's own headers, serval-node), and those own headers for a bare HTTP answer."""

    __slots__ = ("block", "own")

    def __init__(self, own: tuple[Header, ...] = ()) -> None:
        self.own = own
        self.block = _STATUS_200 + encode_headers([("content-type", "application/grpc"), *own])


NO_OWN_HEADERS = ResponseHeaders()


class CallOwner(Protocol):
    """What a call needs of its connection."""

    write_paused: bool
    response_headers: ResponseHeaders
    peer_max_frame_bytes: int  # the client's SETTINGS_MAX_FRAME_SIZE

    def write(self, data: bytes) -> None: ...

    def send_pending(self, call: ServerCall) -> None: ...

    def consumed(self, call: ServerCall, size: int) -> None:
        """The call no longer holds `size` received bytes: credit the windows."""


class ServerCall:
    """One HTTP/2 stream carrying one gRPC call."""

    __slots__ = ("__weakref__", "_buffer", "_buffer_reserved", "_drainer", "_headers_sent",
                 "_pending",
                 "_pending_bytes", "_read_reserved", "_reserved", "_trailers", "_unread_bytes",
                 "_waiter", "budget", "content_left", "finished", "headers", "max_message_bytes",
                 "max_messages", "messages", "owner", "path", "progress_at", "received_ns",
                 "remote_closed", "send_window", "stream_id", "task", "window")

    def __init__(self, owner: CallOwner, stream_id: int, headers: list[Header], *,
                 received_ns: int, send_window: int, receive_window: int,
                 max_message_bytes: int, max_messages: int, budget: ReceiveBudget) -> None:
        self.owner, self.stream_id, self.headers = owner, stream_id, headers
        self.path = ""
        self.received_ns = received_ns
        self.send_window = send_window
        self.window = InboundWindow(receive_window)
        self.max_message_bytes, self.max_messages, self.budget = (
            max_message_bytes, max_messages, budget)
        # (message, window credit due when read, budget bytes reserved)
        self.messages: deque[tuple[bytes, int, int]] = deque()
        self.remote_closed = False
        self.content_left = -1  # DATA bytes its content-length still announces (-1: none)
        self.finished = False
        self.progress_at = 0.0  # loop time of its last frame (the connection sets it)
        self.task: asyncio.Task[None] | None = None
        self._buffer = bytearray()
        self._buffer_reserved = 0  # reserved for the message being assembled: len(_buffer)
        self._reserved = 0  # all budget bytes this call holds
        self._read_reserved = 0  # of them, the last read message's
        self._unread_bytes = 0  # window credit owed for unread queued messages
        self._waiter: asyncio.Future[None] | None = None
        self._drainer: asyncio.Future[None] | None = None
        self._headers_sent = False
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._trailers: bytes | None = None

    # reading ---------------------------------------------------------------------------------

    def metadata(self) -> list[Header]:
        """Custom metadata: every header that is not a pseudo-header."""
        return [(name, value) for name, value in self.headers if not name.startswith(":")]

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None

    @property
    def message_count(self) -> int:
        return len(self.messages)

    def next_message(self) -> bytes | None:
        """The next received message, or None; its bytes are credited back to the client."""
        if not self.messages:
            return None
        message, credit, reserved = self.messages.popleft()
        if self._read_reserved:
            self._reserved -= self._read_reserved
            self.budget.release(self._read_reserved)
        self._read_reserved = reserved
        if credit:
            self._unread_bytes -= credit
            self.owner.consumed(self, credit)
        return message

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
        return self.next_message()

    def hold(self, size: int) -> None:
        """Count `size` received bytes against the budget while the call lives (its header
        list); CallFailed(RESOURCE_EXHAUSTED) when they do not fit."""
        self._take(size)

    @property
    def assembling(self) -> bool:
        """Part of a message has arrived and the rest has not."""
        return bool(self._buffer)

    def receive(self, data: bytes) -> int:
        """Take one DATA frame's content; returns the bytes to credit back now (buffered ones)."""
        buffer = self._buffer
        size = len(data)
        if not buffer and size >= 5 and _MESSAGE_PREFIX.unpack_from(data)[1] == size - 5:
            self._take(size)  # the usual case: one whole message
            self._deliver(data[0], data[5:], size, size)
            return 0
        self._take(size)
        self._buffer_reserved += size
        buffer += data
        while len(buffer) >= 5:
            compressed, length = _MESSAGE_PREFIX.unpack_from(buffer)
            self._check_size(length)
            if len(buffer) < 5 + length:
                if not self.budget.fits(5 + length - len(buffer)):  # it could never be held
                    raise CallFailed(GrpcStatus.RESOURCE_EXHAUSTED,
                                     self.budget.refusal_message(length))
                break
            message = bytes(buffer[5:5 + length])
            del buffer[:5 + length]
            self._buffer_reserved -= 5 + length
            self._deliver(compressed, message, 0, 5 + length)
        return size

    def _take(self, size: int) -> None:
        if not self.budget.reserve(size):
            raise CallFailed(GrpcStatus.RESOURCE_EXHAUSTED, self.budget.refusal_message(size))
        self._reserved += size

    def _check_size(self, length: int) -> None:
        if length > self.max_message_bytes:
            raise CallFailed(GrpcStatus.RESOURCE_EXHAUSTED, f"received message larger than max "
                             f"({length} vs. {self.max_message_bytes})")

    def _deliver(self, compressed: int, message: bytes, credit: int, reserved: int) -> None:
        self._check_size(len(message))
        if len(self.messages) >= self.max_messages:
            raise CallFailed(GrpcStatus.RESOURCE_EXHAUSTED,
                             f"more than {self.max_messages} request messages of one stream "
                             "waiting to be read")
        if compressed:
            message = _decompress(compressed, message, self.header("grpc-encoding"),
                                  self.max_message_bytes)
        self.messages.append((message, credit, reserved))
        self._unread_bytes += credit
        self.wake()

    def wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def release(self) -> int:
        """Give back what the call holds (budget, unread messages); returns their window credit."""
        if self._reserved:
            self.budget.release(self._reserved)
            self._reserved = self._read_reserved = self._buffer_reserved = 0
        unread, self._unread_bytes = self._unread_bytes, 0
        self.messages.clear()
        self._buffer.clear()
        return unread

    def close(self) -> int:
        """The stream is gone (reset, connection lost): stop the call, drop what it holds."""
        self.finished = self.remote_closed = True
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
        self._pending.clear()
        self._pending_bytes = 0
        self._trailers = None
        self.wake_writer()
        return self.release()

    # writing ---------------------------------------------------------------------------------

    def send_message(self, payload: bytes) -> None:
        if self.finished:
            return
        self._queue_message(payload)
        self.owner.send_pending(self)

    def send_reply(self, payload: bytes) -> None:
        """A unary call's one reply, then OK: queued together and sent in one pass of flow
        control (every unary call's path)."""
        if self.finished:
            return
        self._queue_message(payload)
        self.finish(GrpcStatus.OK)

    def _queue_message(self, payload: bytes) -> None:
        if not self._headers_sent:
            self._headers_sent = True
            self.owner.write(h2.frame(h2.HEADERS, h2.END_HEADERS, self.stream_id,
                                      self.owner.response_headers.block))
        self._pending.append(_MESSAGE_PREFIX.pack(0, len(payload)) + payload)
        self._pending_bytes += 5 + len(payload)

    def backlogged(self) -> bool:
        """Whether the client does not take our replies now (flow control, or a full socket):
        then `drain` before the next (asked first, as most replies find no backlog)."""
        return (self._pending_bytes > _DRAIN_BYTES or self.owner.write_paused) \
            and not self.finished

    async def drain(self) -> None:
        """Wait while the client does not take our replies (flow control, or a full socket)."""
        while self.backlogged():
            self._drainer = asyncio.get_running_loop().create_future()
            try:
                await self._drainer
            finally:
                self._drainer = None

    def wake_writer(self) -> None:
        if self._drainer is not None and not self._drainer.done():
            self._drainer.set_result(None)

    def finish(self, status: GrpcStatus, message: str = "",
               extra: tuple[tuple[str, str], ...] = ()) -> None:
        """End the call with a status (trailers, `extra` among them; trailers-only when nothing
        was sent)."""
        if self.finished:
            return
        self.finished = True
        if status is GrpcStatus.OK and not message and not extra:
            block = _OK_TRAILERS  # every successful call's: encoded once
        else:
            trailers = [("grpc-status", str(int(status)))]
            if message:
                trailers.append(("grpc-message", percent_encode(message)))
            trailers.extend(extra)
            block = encode_headers(trailers)
        if not self._headers_sent:
            block = self.owner.response_headers.block + block
        if len(block) <= h2.DEFAULT_MAX_FRAME_BYTES:  # fits any peer's frames
            self._trailers = h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM,
                                      self.stream_id, block)
        else:  # (a long grpc-message) split to fit the peer's SETTINGS_MAX_FRAME_SIZE
            self._trailers = h2.headers_frames(self.stream_id, block, h2.END_STREAM,
                                               self.owner.peer_max_frame_bytes)
        self.owner.send_pending(self)

    def abort(self, status: GrpcStatus, message: str,
              extra: tuple[tuple[str, str], ...] = ()) -> None:
        """End the call now with a status: replies not yet sent are dropped."""
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
        self._pending.clear()
        self._pending_bytes = 0
        self.finish(status, message, extra)

    def reject(self, http_status: int, extra: tuple[Header, ...] = ()) -> None:
        """Answer with a bare HTTP status (e.g. 415 for a request that is not gRPC)."""
        self.finished = True
        self._trailers = h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, self.stream_id,
                                  encode_headers([(":status", str(http_status)), *extra,
                                                  *self.owner.response_headers.own]))
        self.owner.send_pending(self)

    @property
    def pending_bytes(self) -> int:
        """Reply bytes queued and not yet sent."""
        return self._pending_bytes

    @property
    def has_output(self) -> bool:
        return bool(self._pending) or self._trailers is not None

    def take_sendable(self, connection_window: int,
                      max_frame_bytes: int) -> tuple[list[bytes], int]:
        """DATA frames (then trailers) that the flow-control windows allow now, and their size."""
        out: list[bytes] = []
        window = connection_window
        pending = self._pending
        while pending:
            allowed = min(self.send_window, window, max_frame_bytes)
            if allowed <= 0:
                break
            chunk = pending[0]
            if len(chunk) <= allowed:
                pending.popleft()
            else:
                pending[0] = chunk[allowed:]
                chunk = chunk[:allowed]
            self.send_window -= len(chunk)
            window -= len(chunk)
            out.append(h2.frame(h2.DATA, 0, self.stream_id, chunk))
        sent = connection_window - window
        if sent:
            self._pending_bytes -= sent
            if self._drainer is not None and self._pending_bytes <= _DRAIN_BYTES:
                self.wake_writer()
        if not pending and self._trailers is not None:
            out.append(self._trailers)
            self._trailers = None
        return out, sent


def _decompress(flag: int, message: bytes, encoding: str | None, limit_bytes: int) -> bytes:
    """A compressed message inflated. A flag other than 1, or 1 without an encoding, is the
    client's error: INVALID_ARGUMENT (grpc-go says INTERNAL, which here is kept for the
    server's own faults, as the fuzzers check); an encoding we lack is UNIMPLEMENTED, naming
    those we have in grpc-accept-encoding (the gRPC compression spec)."""
    if flag != 1:
        raise CallFailed(GrpcStatus.INVALID_ARGUMENT, f"message flag {flag}: neither 0 "
                         "(plain) nor 1 (compressed)")
    if encoding is None or encoding == "identity":
        raise CallFailed(GrpcStatus.INVALID_ARGUMENT, "compressed flag set with identity or "
                         "no grpc-encoding")
    if encoding not in ("gzip", "deflate"):
        raise CallFailed(GrpcStatus.UNIMPLEMENTED, f"compressed message with unsupported "
                         f"grpc-encoding '{encoding[:40]}' (supported: gzip, deflate)",
                         (("grpc-accept-encoding", ACCEPT_ENCODING),))
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        plain = inflater.decompress(message, limit_bytes + 1)
    except zlib.error as exc:
        raise CallFailed(GrpcStatus.INVALID_ARGUMENT,
                         f"the message is not valid {encoding} data: {exc}") from None
    if len(plain) > limit_bytes:
        raise CallFailed(GrpcStatus.RESOURCE_EXHAUSTED, f"decompressed message larger than max "
                         f"({limit_bytes} bytes)")
    return plain


def percent_encode(message: str) -> str:
    """grpc-message encoding: printable ASCII except '%' as is, every other byte as %XX."""
    raw = message.encode("utf-8")
    if all(byte in _PERCENT_SAFE for byte in raw):
        return message
    return "".join(chr(b) if b in _PERCENT_SAFE else f"%{b:02X}" for b in raw)
