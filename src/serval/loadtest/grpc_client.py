"""A lean gRPC client connection for load generation: raw HTTP/2 frames, callbacks, no threads.

Request headers are encoded once per method (literal fields, no HPACK table state), request
messages are pre-serialized bytes, and answers are reported by callback: `on_message(stream,
message)` for each reply message and `on_end(stream, grpc_status, grpc_message)` when a call ends.
Works against any gRPC server (Serval, Triton, grpcio): windows, frame sizes and
SETTINGS_MAX_CONCURRENT_STREAMS are honoured (calls beyond it wait, in order, for a stream to end).
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from collections.abc import Callable
from typing import cast

from serval.http2 import frames as h2
from serval.http2.hpack import HpackDecoder, encode_headers

WINDOW_BYTES = 16 * 1024 * 1024
CONNECTION_WINDOW_BYTES = 1024 * 1024 * 1024
_ACK_BYTES = 4 * 1024 * 1024
_PREFIX = struct.Struct(">BL")
_NO_STATUS = -1  # the call ended without a grpc-status (a broken answer)

OnMessage = Callable[[int, bytes], None]
OnEnd = Callable[[int, int, str], None]


def request_headers(path: str, authority: str, metadata: dict[str, str] | None = None) -> bytes:
    """The header block of a call to `path` (constant: it uses no table)."""
    headers = [(":method", "POST"), (":scheme", "http"), (":path", path),
               (":authority", authority), ("content-type", "application/grpc"),
               ("te", "trailers")]
    headers += list((metadata or {}).items())
    return encode_headers(headers)


def grpc_message(payload: bytes) -> bytes:
    """A length-prefixed, uncompressed gRPC message."""
    return _PREFIX.pack(0, len(payload)) + payload


class _Stream:
    __slots__ = ("buffer", "ended", "message", "opened", "send_window", "status", "unacked",
                 "waiting")

    def __init__(self, send_window: int) -> None:
        self.buffer = b""
        self.status = _NO_STATUS
        self.message = ""
        self.send_window = send_window
        self.unacked = 0
        self.opened = False
        self.ended = False  # we sent END_STREAM: nothing more may follow
        self.waiting: list[tuple[bytes, bool]] = []  # DATA sent before the stream could open


class GrpcClientConnection(asyncio.Protocol):
    """One HTTP/2 connection carrying many concurrent calls."""

    def __init__(self, on_message: OnMessage, on_end: OnEnd,
                 on_lost: Callable[[GrpcClientConnection], None] | None = None) -> None:
        self.on_message, self.on_end, self.on_lost = on_message, on_end, on_lost
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, _Stream] = {}
        self.next_stream_id = 1
        self.decoder = HpackDecoder()
        self.reader = h2.FrameReader(h2.DEFAULT_MAX_FRAME_BYTES * 64)
        self.peer_window_bytes = h2.DEFAULT_WINDOW_BYTES
        self.peer_max_frame_bytes = h2.DEFAULT_MAX_FRAME_BYTES
        self.send_window = h2.DEFAULT_WINDOW_BYTES
        self.blocked: deque[tuple[int, bytes, bool]] = deque()  # waiting for flow control
        self.max_open_streams = 2**31  # the server's SETTINGS_MAX_CONCURRENT_STREAMS
        self.open_streams = 0
        self.queued: deque[tuple[int, bytes]] = deque()  # calls waiting for a stream slot
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False
        self._unacked = 0
        self._out: list[bytes] = []

    # calls -----------------------------------------------------------------------------------

    def unary(self, headers: bytes, message: bytes) -> int:
        """Start a unary call (message already length-prefixed); returns its stream id."""
        stream_id = self._open(headers)
        self._send_data(stream_id, message, end_stream=True)
        return stream_id

    def open_stream(self, headers: bytes) -> int:
        return self._open(headers)

    def stream_send(self, stream_id: int, message: bytes) -> None:
        self._send_data(stream_id, message, end_stream=False)

    def stream_close(self, stream_id: int) -> None:
        """Half-close (once: DATA after END_STREAM is a STREAM_CLOSED error)."""
        self._send_data(stream_id, b"", end_stream=True)

    def cancel(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None and stream.opened:
            self._out.append(h2.rst_stream(stream_id, h2.CANCEL))
            self._closed_one()

    def flush(self) -> None:
        """Write everything queued since the last flush in one go."""
        if self._out and self.transport is not None and not self.closed:
            out, self._out = self._out, []
            self.transport.write(b"".join(out))

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _open(self, headers: bytes) -> int:
        stream_id = self.next_stream_id
        self.next_stream_id += 2
        self.streams[stream_id] = _Stream(self.peer_window_bytes)
        if self.queued or self.open_streams >= self.max_open_streams:
            self.queued.append((stream_id, headers))
        else:
            self._start(stream_id, headers)
        return stream_id

    def _start(self, stream_id: int, headers: bytes) -> None:
        stream = self.streams[stream_id]
        stream.opened = True
        self.open_streams += 1
        self._out.append(h2.frame(h2.HEADERS, h2.END_HEADERS, stream_id, headers))
        waiting, stream.waiting = stream.waiting, []
        for data, end_stream in waiting:
            self._emit(stream_id, stream, data, end_stream)

    def _closed_one(self) -> None:
        """A stream ended: open waiting calls while the server allows."""
        self.open_streams -= 1
        self._open_queued()

    def _open_queued(self) -> None:
        while self.queued and self.open_streams < self.max_open_streams:
            stream_id, headers = self.queued.popleft()
            if stream_id in self.streams:  # not cancelled while it waited
                self._start(stream_id, headers)

    def _send_data(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        stream = self.streams.get(stream_id)
        if stream is None or stream.ended:
            return
        stream.ended = end_stream
        if stream.opened:
            self._emit(stream_id, stream, data, end_stream)
        else:
            stream.waiting.append((data, end_stream))

    def _emit(self, stream_id: int, stream: _Stream, data: bytes, end_stream: bool) -> None:
        size = len(data)
        if self.blocked or size > min(stream.send_window, self.send_window,
                                      self.peer_max_frame_bytes):
            self.blocked.append((stream_id, data, end_stream))
            self._drain()
            return
        stream.send_window -= size
        self.send_window -= size
        self._out.append(h2.frame(h2.DATA, h2.END_STREAM if end_stream else 0, stream_id, data))

    def _drain(self) -> None:
        """Send what waits for flow control, in order, as far as the windows allow."""
        while self.blocked:
            stream_id, data, end_stream = self.blocked[0]
            stream = self.streams.get(stream_id)
            if stream is None:
                self.blocked.popleft()
                continue
            allowed = min(stream.send_window, self.send_window, self.peer_max_frame_bytes)
            if allowed <= 0 and data:
                return
            chunk, rest = data[:allowed], data[allowed:]
            stream.send_window -= len(chunk)
            self.send_window -= len(chunk)
            last = not rest
            self._out.append(h2.frame(h2.DATA, h2.END_STREAM if end_stream and last else 0,
                                      stream_id, chunk))
            if last:
                self.blocked.popleft()
            else:
                self.blocked[0] = (stream_id, rest, end_stream)

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(h2.PREFACE + h2.settings_frame({
            h2.ENABLE_PUSH: 0, h2.INITIAL_WINDOW_SIZE: WINDOW_BYTES,
        }) + h2.window_update(0, CONNECTION_WINDOW_BYTES - h2.DEFAULT_WINDOW_BYTES))

    def data_received(self, data: bytes) -> None:
        try:
            for kind, flags, stream_id, payload in self.reader.feed(data):
                if kind == h2.DATA:
                    self._on_data(flags, stream_id, payload)
                elif kind == h2.HEADERS or kind == h2.CONTINUATION:
                    self._on_headers(flags, stream_id, payload, kind)
                else:
                    self._on_control(kind, flags, stream_id, payload)
        except h2.ProtocolError:
            self.close()
            return
        if self._unacked >= _ACK_BYTES:
            self._out.append(h2.window_update(0, self._unacked))
            self._unacked = 0
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(str(exc or "connection closed")))
        streams, self.streams = self.streams, {}
        for stream_id in streams:
            self.on_end(stream_id, _NO_STATUS, "connection lost")
        if self.on_lost is not None:
            self.on_lost(self)

    # frames ----------------------------------------------------------------------------------

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._unacked += len(payload)
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        stream.unacked += len(payload)
        if stream.unacked >= _ACK_BYTES and not flags & h2.END_STREAM:
            self._out.append(h2.window_update(stream_id, stream.unacked))
            stream.unacked = 0
        buffer = stream.buffer + h2.strip_padding(flags, payload) if stream.buffer else \
            h2.strip_padding(flags, payload)
        while len(buffer) >= 5:
            length = _PREFIX.unpack_from(buffer)[1]
            if len(buffer) < 5 + length:
                break
            message, buffer = buffer[5:5 + length], buffer[5 + length:]
            self.on_message(stream_id, message)
        stream.buffer = buffer
        if flags & h2.END_STREAM:
            self._end(stream_id)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes, kind: int) -> None:
        if not flags & h2.END_HEADERS:
            raise h2.ProtocolError("header blocks split over CONTINUATION are not supported")
        block = h2.strip_padding(flags, payload, priority_bytes=5) if kind == h2.HEADERS \
            else payload
        headers = self.decoder.decode(block)
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        for name, value in headers:
            if name == "grpc-status":
                stream.status = int(value) if value.isascii() and value.isdigit() else _NO_STATUS
            elif name == "grpc-message":
                stream.message = value
        if flags & h2.END_STREAM:
            self._end(stream_id)

    def _end(self, stream_id: int) -> None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None:
            self._closed_one()
            self.on_end(stream_id, stream.status, stream.message)

    def _on_control(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == h2.SETTINGS and not flags & h2.ACK:
            self._on_settings(h2.parse_settings(payload))
        elif kind == h2.WINDOW_UPDATE:
            increment = h2.parse_u32(payload, "WINDOW_UPDATE")
            if stream_id == 0:
                self.send_window += increment
            elif stream_id in self.streams:
                self.streams[stream_id].send_window += increment
            self._drain()
        elif kind == h2.PING and not flags & h2.ACK:
            self._out.append(h2.frame(h2.PING, h2.ACK, 0, payload))
        elif kind == h2.RST_STREAM:
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                self._closed_one()
                code = h2.parse_u32(payload, "RST_STREAM")
                self.on_end(stream_id, _NO_STATUS, f"stream reset by the server (code {code})")
        elif kind == h2.GOAWAY:
            self.closed = True

    def _on_settings(self, settings: dict[int, int]) -> None:
        self.peer_max_frame_bytes = settings.get(h2.MAX_FRAME_SIZE, self.peer_max_frame_bytes)
        self.max_open_streams = settings.get(h2.MAX_CONCURRENT_STREAMS, self.max_open_streams)
        self._open_queued()
        if h2.INITIAL_WINDOW_SIZE in settings:
            window = settings[h2.INITIAL_WINDOW_SIZE]
            delta, self.peer_window_bytes = window - self.peer_window_bytes, window
            for stream in self.streams.values():
                stream.send_window += delta
        self._out.append(h2.frame(h2.SETTINGS, h2.ACK, 0))
        if not self.ready.done():
            self.ready.set_result(None)
        self._drain()
