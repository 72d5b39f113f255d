"""One gRPC client connection: HTTP/2 framing, flow control and streams, over asyncio.

Each HTTP/2 stream is a `ServerCall` (stream.py). A unary call starts when its request is
complete; a client-streaming call starts at its headers and reads messages as they arrive. Frames
written while handling a burst of requests or answers go out in one socket write per loop turn.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, cast

from serval.http2 import frames as h2
from serval.http2.hpack import HpackDecoder
from serval.server.grpc.stream import INTERNAL, UNIMPLEMENTED, CallFailed, ServerCall
from serval.server.limits import TransportGuards

log = logging.getLogger(__name__)

STREAM_WINDOW_BYTES = 16 * 1024 * 1024  # what we let each stream send before acknowledging
CONNECTION_WINDOW_BYTES = 1024 * 1024 * 1024
_ACK_STREAM_BYTES = STREAM_WINDOW_BYTES // 4
_ACK_CONNECTION_BYTES = CONNECTION_WINDOW_BYTES // 4
_MAX_RECEIVED_FRAME_BYTES = 1024 * 1024

class CallRunner(Protocol):
    """What runs a call once it may start (the service layer)."""

    def is_client_streaming(self, path: str) -> bool | None:
        """None: no such method."""

    def run(self, call: ServerCall) -> Coroutine[Any, Any, None]: ...


class GrpcConnection(asyncio.Protocol):
    """The server side of one HTTP/2 connection."""

    def __init__(self, runner: CallRunner, connections: set[GrpcConnection],
                 guards: TransportGuards) -> None:
        self.runner, self.connections = runner, connections
        self.guards, self.limits = guards, guards.limits
        self.max_message_bytes = guards.limits.max_message_bytes
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, ServerCall] = {}
        self.last_stream_id = 0
        self.decoder = HpackDecoder()
        self.reader = h2.FrameReader(_MAX_RECEIVED_FRAME_BYTES)
        self.peer_window_bytes = h2.DEFAULT_WINDOW_BYTES  # the peer's initial stream window
        self.peer_max_frame_bytes = h2.DEFAULT_MAX_FRAME_BYTES
        self.send_window = h2.DEFAULT_WINDOW_BYTES
        self.blocked: set[ServerCall] = set()
        self.closing = False
        self._preface: bytes | None = b""
        self._unacked_bytes = 0
        self._continuation: tuple[int, int, bytearray] | None = None
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._handlers: dict[int, Callable[[int, int, bytes], None]] = {
            h2.DATA: self._on_data, h2.HEADERS: self._on_headers,
            h2.RST_STREAM: self._on_rst_stream, h2.SETTINGS: self._on_settings,
            h2.PING: self._on_ping, h2.GOAWAY: self._on_goaway,
            h2.WINDOW_UPDATE: self._on_window_update, h2.PUSH_PROMISE: self._on_push_promise,
        }

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:  # find peers that vanished without closing (long-lived channels)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self.write(h2.settings_frame({
            h2.INITIAL_WINDOW_SIZE: STREAM_WINDOW_BYTES,
            h2.MAX_FRAME_SIZE: _MAX_RECEIVED_FRAME_BYTES,
            h2.ENABLE_PUSH: 0,
        }))
        self.write(h2.window_update(0, CONNECTION_WINDOW_BYTES - h2.DEFAULT_WINDOW_BYTES))

    def data_received(self, data: bytes) -> None:
        if self._preface is not None:
            data = self._check_preface(data)
            if not data:
                return
        try:
            handlers = self._handlers
            for kind, flags, stream_id, payload in self.reader.feed(data):
                if self._continuation is not None:
                    self._on_continuation(kind, flags, stream_id, payload)
                    continue
                handler = handlers.get(kind)
                if handler is not None:
                    handler(flags, stream_id, payload)
                elif kind == h2.CONTINUATION:
                    raise h2.ProtocolError("CONTINUATION without HEADERS")
        except h2.ProtocolError as exc:
            self._fail(exc)
            return
        if self._unacked_bytes >= _ACK_CONNECTION_BYTES:
            self.write(h2.window_update(0, self._unacked_bytes))
            self._unacked_bytes = 0

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        for call in self.calls.values():
            call.finished = True
            if call.task is not None:
                call.task.cancel()  # the client is gone: drop its queued work
        self.calls.clear()
        self.blocked.clear()
        self.transport = None

    # output ----------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        """Queue bytes; everything queued in one loop iteration goes out in one write."""
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        out, self._out = self._out, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(out))
        if self.closing and not self.calls:
            self._close()

    def send_pending(self, call: ServerCall) -> None:
        """Write what the call may send now; remember it if flow control holds the rest."""
        frames, sent_bytes = call._take_sendable(self.send_window, self.peer_max_frame_bytes)
        self.send_window -= sent_bytes
        for data_frame in frames:
            self.write(data_frame)
        if call._pending or call._trailers is not None:
            self.blocked.add(call)
            return
        self.blocked.discard(call)
        if call.finished:
            self._forget(call)

    def _forget(self, call: ServerCall) -> None:
        if self.calls.pop(call.stream_id, None) is not None and not call.remote_closed:
            self.write(h2.rst_stream(call.stream_id, h2.NO_ERROR))  # we need no more of it

    # frames ----------------------------------------------------------------------------------

    def _check_preface(self, data: bytes) -> bytes:
        assert self._preface is not None
        seen = self._preface + data
        if len(seen) < len(h2.PREFACE):
            if not h2.PREFACE.startswith(seen):
                self._close()
            self._preface = seen
            return b""
        if not seen.startswith(h2.PREFACE):
            log.info("closing a connection that does not speak HTTP/2 (prior knowledge)")
            self._close()
            return b""
        self._preface = None
        return seen[len(h2.PREFACE):]

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise h2.ProtocolError("DATA on stream 0")
        self._unacked_bytes += len(payload)
        call = self.calls.get(stream_id)
        if call is None or call.remote_closed:
            return  # a stream we already ended or reset: counted for the connection only
        call._unacked_bytes += len(payload)
        if flags & h2.PADDED:
            payload = h2.strip_padding(flags, payload)
        try:
            call._feed(payload)
        except CallFailed as exc:
            self._abort_call(call, exc)
            return
        if flags & h2.END_STREAM:
            self._end_remote(call)
        elif call._unacked_bytes >= _ACK_STREAM_BYTES:
            self.write(h2.window_update(stream_id, call._unacked_bytes))
            call._unacked_bytes = 0

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise h2.ProtocolError("HEADERS on stream 0")
        block = h2.strip_padding(flags, payload, priority_bytes=5)
        if flags & h2.END_HEADERS:
            self._on_header_block(flags, stream_id, block)
        else:
            self._continuation = (stream_id, flags, bytearray(block))

    def _on_continuation(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        assert self._continuation is not None
        first_stream, first_flags, block = self._continuation
        if kind != h2.CONTINUATION or stream_id != first_stream:
            raise h2.ProtocolError("expected CONTINUATION of the open header block")
        block += payload
        if flags & h2.END_HEADERS:
            self._continuation = None
            self._on_header_block(first_flags, stream_id, bytes(block))

    def _on_header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        headers = self.decoder.decode(block)
        call = self.calls.get(stream_id)
        if call is not None:  # trailers from the client end its stream
            if flags & h2.END_STREAM:
                self._end_remote(call)
            return
        if stream_id <= self.last_stream_id or not stream_id & 1:
            if stream_id & 1:
                return  # a late frame for a stream that is gone
            raise h2.ProtocolError(f"client opened stream {stream_id} (must be odd, increasing)")
        self.last_stream_id = stream_id
        call = ServerCall(self, stream_id, headers, received_ns=time.perf_counter_ns(),
                          send_window=self.peer_window_bytes)
        self.calls[stream_id] = call
        if not self._start(call):
            return
        if flags & h2.END_STREAM:
            self._end_remote(call)

    def _start(self, call: ServerCall) -> bool:
        """Check the call can run; client-streaming calls start now, unary ones at their end."""
        path = call.header(":path") or ""
        call.path = path
        if self.closing:
            self.calls.pop(call.stream_id, None)
            self.write(h2.rst_stream(call.stream_id, h2.REFUSED_STREAM))
            return False
        streaming = self.runner.is_client_streaming(path)
        if streaming is None:
            call.finish(UNIMPLEMENTED, f"Method not found: {path}")
            return False
        if not (call.header("content-type") or "").startswith("application/grpc"):
            call.finish(INTERNAL, "content-type must be application/grpc")
            return False
        if streaming:
            call.task = asyncio.get_running_loop().create_task(self.runner.run(call))
        return True

    def _end_remote(self, call: ServerCall) -> None:
        call.remote_closed = True
        if call.finished:
            self._forget(call)
        elif call.task is None:
            call.task = asyncio.get_running_loop().create_task(self.runner.run(call))
        else:
            call._wake()

    def _abort_call(self, call: ServerCall, exc: CallFailed) -> None:
        if call.task is not None:
            call.task.cancel()
        call.remote_closed = True
        call.finish(exc.status, exc.message)

    def _on_rst_stream(self, flags: int, stream_id: int, payload: bytes) -> None:
        call = self.calls.pop(stream_id, None)
        if call is None:
            return
        call.finished = call.remote_closed = True
        self.blocked.discard(call)
        if call.task is not None:
            call.task.cancel()  # the client cancelled or its deadline passed: free the slot

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if flags & h2.ACK:
            return
        settings = h2.parse_settings(payload)
        if h2.MAX_FRAME_SIZE in settings:
            self.peer_max_frame_bytes = settings[h2.MAX_FRAME_SIZE]
        if h2.INITIAL_WINDOW_SIZE in settings:
            window = settings[h2.INITIAL_WINDOW_SIZE]
            if window > h2.MAX_WINDOW_BYTES:
                raise h2.ProtocolError("initial window too large", h2.FLOW_CONTROL_ERROR)
            delta, self.peer_window_bytes = window - self.peer_window_bytes, window
            for call in self.calls.values():
                call.send_window += delta
        self.write(h2.frame(h2.SETTINGS, h2.ACK, 0))
        self._unblock()

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if len(payload) != 8:
            raise h2.ProtocolError("PING payload must be 8 bytes", h2.FRAME_SIZE_ERROR)
        if not flags & h2.ACK:
            self.write(h2.frame(h2.PING, h2.ACK, 0, payload))

    def _on_goaway(self, flags: int, stream_id: int, payload: bytes) -> None:
        self.closing = True
        if not self.calls:
            self._close()

    def _on_window_update(self, flags: int, stream_id: int, payload: bytes) -> None:
        increment = h2.parse_u32(payload, "WINDOW_UPDATE")
        if stream_id == 0:
            self.send_window += increment
            self._unblock()
            return
        call = self.calls.get(stream_id)
        if call is not None:
            call.send_window += increment
            if call in self.blocked:
                self.send_pending(call)

    def _on_push_promise(self, flags: int, stream_id: int, payload: bytes) -> None:
        raise h2.ProtocolError("clients must not push")

    def _unblock(self) -> None:
        for call in list(self.blocked):
            if self.send_window <= 0:
                return
            self.send_pending(call)

    # lifecycle -------------------------------------------------------------------------------

    def shut_down(self) -> None:
        """Refuse new streams (GOAWAY), finish the open ones, then close."""
        if self.transport is None:
            return
        self.closing = True
        self.write(h2.goaway(self.last_stream_id, h2.NO_ERROR))
        if not self.calls:
            self._flush()
            self._close()

    def _fail(self, exc: h2.ProtocolError) -> None:
        log.info("closing a gRPC connection: %s", exc)
        self.write(h2.goaway(self.last_stream_id, exc.code, str(exc).encode()[:200]))
        self._flush()
        self._close()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
