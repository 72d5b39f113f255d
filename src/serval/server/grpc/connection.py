"""One gRPC client connection: HTTP/2 framing, flow control and streams, over asyncio.

Each HTTP/2 stream is a `ServerCall` (stream.py). A unary call starts when its request is
complete (after the whole read it arrived in, so a stream reset in that read costs nothing); a
client-streaming call starts at its headers and reads messages as they arrive. Frames written
while handling a burst of requests or answers go out in one socket write per loop turn.

Guards (TransportLimits): the connection gate admits it; the client must send its preface and
SETTINGS in time, and a connection without streams is closed when idle; open streams, header
lists, receive windows (credited only as the server consumes) and unread messages are bounded;
control frames and resets are counted per window (http2/abuse.py); reading stops while the client
does not read what we write.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, cast

from serval.http2 import frames as h2
from serval.http2.abuse import AbuseBudget
from serval.http2.flow import InboundWindow, grow_send_window
from serval.http2.hpack import HpackDecoder
from serval.server.grpc.stream import CallFailed, ServerCall
from serval.server.limits import TransportGuards

log = logging.getLogger(__name__)

_MAX_RECEIVED_FRAME_BYTES = 1024 * 1024
_READ_SLICE_BYTES = 64 * 1024  # then one loop turn for everyone else (libuv reads up to 8 MiB)
_UNIMPLEMENTED = 12
_SMALL_WINDOW_UPDATE = 1024  # increments below this count as control frames


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
        limits = guards.limits
        self.transport: asyncio.Transport | None = None
        self.calls: dict[int, ServerCall] = {}
        self.last_stream_id = 0
        self.decoder = HpackDecoder(max_list_bytes=limits.h2_max_header_list_bytes)
        self.max_block_bytes = 2 * limits.h2_max_header_list_bytes
        self.max_frame_bytes = max(h2.DEFAULT_MAX_FRAME_BYTES,
                                   min(_MAX_RECEIVED_FRAME_BYTES, limits.h2_stream_window_bytes))
        self.reader = h2.FrameReader(self.max_frame_bytes)
        self.window = InboundWindow(limits.h2_connection_window_bytes)
        self.abuse = AbuseBudget(limits.h2_max_control_frames, limits.h2_max_resets)
        self.peer_window_bytes = h2.DEFAULT_WINDOW_BYTES  # the peer's initial stream window
        self.peer_max_frame_bytes = h2.DEFAULT_MAX_FRAME_BYTES
        self.send_window = h2.DEFAULT_WINDOW_BYTES
        self.blocked: set[ServerCall] = set()
        self.closing = False
        self.write_paused = False
        self.idle_since = 0.0
        self._preface: bytes | None = b""
        self._settled = False  # the client's first SETTINGS arrived
        self._continuation: tuple[int, int, bytearray] | None = None
        self._starting: list[ServerCall] = []
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._window_ends = 0.0
        self._read_bytes = 0

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if not self.guards.gate.admit(self):
            self.transport.abort()
            self.transport = None
            return
        self.connections.add(self)
        sock = transport.get_extra_info("socket")
        if sock is not None:  # find peers that vanished without closing (long-lived channels)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        limits = self.limits
        self.write(h2.settings_frame({
            h2.MAX_CONCURRENT_STREAMS: limits.h2_max_concurrent_streams,
            h2.INITIAL_WINDOW_SIZE: limits.h2_stream_window_bytes,
            h2.MAX_FRAME_SIZE: self.max_frame_bytes,
            h2.MAX_HEADER_LIST_SIZE: limits.h2_max_header_list_bytes,
            h2.ENABLE_PUSH: 0,
        }))
        extra = limits.h2_connection_window_bytes - h2.DEFAULT_WINDOW_BYTES
        if extra > 0:
            self.write(h2.window_update(0, extra))
        loop = asyncio.get_running_loop()
        self.idle_since = loop.time()
        self._window_ends = self.idle_since + limits.h2_abuse_window_s
        self._timer = loop.call_later(limits.h2_preface_timeout_s, self._on_timer)

    def data_received(self, data: bytes) -> None:
        self._read_bytes += len(data)
        if self._read_bytes > _READ_SLICE_BYTES:
            self._yield_reading()
        if self._preface is not None:
            data = self._check_preface(data)
            if not data:
                return
        try:
            for kind, flags, stream_id, payload in self.reader.feed(data):
                if self._continuation is not None:
                    self._on_continuation(kind, flags, stream_id, payload)
                    continue
                handler = _HANDLERS.get(kind)
                if not self._settled:
                    if kind != h2.SETTINGS or flags & h2.ACK:
                        raise h2.ProtocolError("the client preface must start with SETTINGS")
                    self._settled = True
                if handler is not None:
                    handler(self, flags, stream_id, payload)
                elif kind == h2.CONTINUATION:
                    raise h2.ProtocolError("CONTINUATION without HEADERS")
                else:
                    self.abuse.control_frame("unknown frame type")  # ignored, but counted
        except h2.ProtocolError as exc:
            self._starting.clear()
            self._fail(exc)
            return
        if self._starting:
            self._start_unary()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guards.gate.release(self)
        self.connections.discard(self)
        for call in self.calls.values():
            call.close()  # the client is gone: drop its queued work
        self.calls.clear()
        self.blocked.clear()
        self._starting.clear()
        self._out.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.transport = None

    def _yield_reading(self) -> None:
        """Stop reading until the loop has run its other callbacks: a flood of cheap frames
        must not hold the loop for a whole burst of reads."""
        self._read_bytes = 0
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
            asyncio.get_running_loop().call_soon(self._read_again)

    def _read_again(self) -> None:
        if self.transport is not None and not self.transport.is_closing() and (
                not self.write_paused):
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        """The client does not read what we write: stop reading what it sends."""
        self.write_paused = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        for call in list(self.calls.values()):
            call.wake_writer()

    # the connection gate ---------------------------------------------------------------------

    def is_idle(self) -> bool:
        return not self.calls

    def evict(self) -> None:
        self.write(h2.goaway(self.last_stream_id, h2.NO_ERROR, b"server at its connection limit"))
        self._flush()
        self._close()

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
        frames, sent_bytes = call.take_sendable(self.send_window, self.peer_max_frame_bytes)
        self.send_window -= sent_bytes
        for data_frame in frames:
            self.write(data_frame)
        if call.has_output:
            self.blocked.add(call)
            return
        self.blocked.discard(call)
        if call.finished:
            self._forget(call)

    def consumed(self, call: ServerCall, size: int) -> None:
        """Credit bytes the server no longer holds to the connection and the stream windows."""
        increment = self.window.consume(size)
        if increment:
            self.write(h2.window_update(0, increment))
        if not call.remote_closed:
            increment = call.window.consume(size)
            if increment:
                self.write(h2.window_update(call.stream_id, increment))

    def _consumed_by_connection(self, size: int) -> None:
        increment = self.window.consume(size)
        if increment:
            self.write(h2.window_update(0, increment))

    def _forget(self, call: ServerCall) -> None:
        if self.calls.pop(call.stream_id, None) is None:
            return
        if not call.remote_closed:
            self.write(h2.rst_stream(call.stream_id, h2.NO_ERROR))  # we need no more of it
        call.task = None  # done with it: no call <-> task cycle
        self._consumed_by_connection(call.release())
        if not self.calls:
            self.idle_since = asyncio.get_running_loop().time()

    def _reset(self, call: ServerCall, code: int) -> None:
        """A stream error: RST_STREAM(code), the call dropped; counted like a client reset
        (a flood of invalid streams, CVE-2019-9514, costs the client its connection)."""
        self.write(h2.rst_stream(call.stream_id, code))
        self.calls.pop(call.stream_id, None)
        self.blocked.discard(call)
        self._consumed_by_connection(call.close())
        if not self.calls:
            self.idle_since = asyncio.get_running_loop().time()
        self.abuse.reset_stream("ended by stream errors")

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
        size = len(payload)
        if not self.window.receive(size):
            raise h2.ProtocolError("DATA beyond the connection window", h2.FLOW_CONTROL_ERROR)
        if not size and not flags & h2.END_STREAM:
            self.abuse.control_frame("empty DATA")
        call = self.calls.get(stream_id)
        if call is None or call.remote_closed:
            if stream_id == 0 or stream_id > self.last_stream_id:
                raise h2.ProtocolError(f"DATA on idle stream {stream_id}")
            self._consumed_by_connection(size)  # a stream already ended: dropped
            if call is not None:
                self._reset(call, h2.STREAM_CLOSED)
            return
        if not call.window.receive(size):
            self._consumed_by_connection(size)
            self._reset(call, h2.FLOW_CONTROL_ERROR)
            return
        credit = 0
        if flags & h2.PADDED:
            content = h2.strip_padding(flags, payload)
            credit, payload = size - len(content), content
        try:
            credit += call.receive(payload)
        except CallFailed as exc:
            self._consumed_by_connection(size)
            call.abort(exc.status, exc.message)  # then RST_STREAM(NO_ERROR): stop sending
            return
        if flags & h2.END_STREAM:
            self._end_remote(call)
        if credit:
            self.consumed(call, credit)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise h2.ProtocolError("HEADERS on stream 0")
        block = h2.strip_padding(flags, payload, priority_bytes=5)
        if not block:
            self.abuse.control_frame("empty HEADERS")
        self._check_block(len(block))
        if flags & h2.END_HEADERS:
            self._on_header_block(flags, stream_id, block)
        else:
            self._continuation = (stream_id, flags, bytearray(block))

    def _on_continuation(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        assert self._continuation is not None
        first_stream, first_flags, block = self._continuation
        if kind != h2.CONTINUATION or stream_id != first_stream:
            raise h2.ProtocolError("expected CONTINUATION of the open header block")
        if not payload:
            self.abuse.control_frame("empty CONTINUATION")
        block += payload
        self._check_block(len(block))
        if flags & h2.END_HEADERS:
            self._continuation = None
            self._on_header_block(first_flags, stream_id, bytes(block))

    def _check_block(self, size: int) -> None:
        if size > self.max_block_bytes:
            raise h2.ProtocolError(f"header block over {self.max_block_bytes} bytes",
                                   h2.ENHANCE_YOUR_CALM)

    def _on_header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        headers = self.decoder.decode(block)  # always: the HPACK table must stay in step
        call = self.calls.get(stream_id)
        if call is not None:  # trailers from the client end its stream
            if call.remote_closed:
                self._reset(call, h2.STREAM_CLOSED)
            elif not flags & h2.END_STREAM:
                self._reset(call, h2.PROTOCOL_ERROR)
            else:
                self._end_remote(call)
            return
        if stream_id <= self.last_stream_id or not stream_id & 1:
            raise h2.ProtocolError(f"client opened stream {stream_id} after "
                                   f"{self.last_stream_id} (ids must be odd and increase)")
        self.last_stream_id = stream_id
        if self.closing or len(self.calls) >= self.limits.h2_max_concurrent_streams:
            self.write(h2.rst_stream(stream_id, h2.REFUSED_STREAM))
            if not self.closing:
                self.abuse.reset_stream("refused past SETTINGS_MAX_CONCURRENT_STREAMS")
            return
        limits = self.limits
        call = ServerCall(self, stream_id, headers, received_ns=time.perf_counter_ns(),
                          send_window=self.peer_window_bytes,
                          receive_window=limits.h2_stream_window_bytes,
                          max_message_bytes=limits.max_message_bytes,
                          max_messages=limits.h2_max_stream_messages, budget=self.guards.budget)
        self.calls[stream_id] = call
        if self._start(call) and flags & h2.END_STREAM:
            self._end_remote(call)

    def _start(self, call: ServerCall) -> bool:
        """Check the call can run; client-streaming calls start now, unary ones at their end."""
        call.path = path = call.header(":path") or ""
        if not (call.header("content-type") or "").startswith("application/grpc"):
            call.reject(415)  # gRPC's HTTP/2 protocol: Unsupported Media Type
            return False
        streaming = self.runner.is_client_streaming(path)
        if streaming is None:
            call.finish(_UNIMPLEMENTED, f"Method not found: {path}")
            return False
        if streaming:
            call.task = asyncio.get_running_loop().create_task(self.runner.run(call))
        return True

    def _end_remote(self, call: ServerCall) -> None:
        call.remote_closed = True
        if call.finished:
            if not call.has_output:
                self._forget(call)
        elif call.task is None:
            self._starting.append(call)  # after this read: a reset in it costs no work
        else:
            call.wake()

    def _start_unary(self) -> None:
        starting, self._starting = self._starting, []
        loop = asyncio.get_running_loop()
        for call in starting:
            if not call.finished and call.task is None:
                call.task = loop.create_task(self.runner.run(call))

    def _on_rst_stream(self, flags: int, stream_id: int, payload: bytes) -> None:
        h2.parse_u32(payload, "RST_STREAM")
        if stream_id == 0 or stream_id > self.last_stream_id:
            raise h2.ProtocolError(f"RST_STREAM on idle stream {stream_id}")
        call = self.calls.pop(stream_id, None)
        if call is None:
            return
        if not call.finished:
            self.abuse.reset_stream("reset by the client before their answer")
        self.blocked.discard(call)
        self._consumed_by_connection(call.close())  # cancelled, or past its deadline
        if not self.calls:
            self.idle_since = asyncio.get_running_loop().time()

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise h2.ProtocolError("SETTINGS on a stream")
        self.abuse.control_frame("SETTINGS")
        if flags & h2.ACK:
            if payload:
                raise h2.ProtocolError("SETTINGS ACK with a payload", h2.FRAME_SIZE_ERROR)
            return
        settings = h2.parse_settings(payload)
        if h2.MAX_FRAME_SIZE in settings:
            self.peer_max_frame_bytes = settings[h2.MAX_FRAME_SIZE]
        if h2.INITIAL_WINDOW_SIZE in settings:
            window = settings[h2.INITIAL_WINDOW_SIZE]
            delta, self.peer_window_bytes = window - self.peer_window_bytes, window
            for call in self.calls.values():
                call.send_window = grow_send_window(call.send_window, delta)
        self.write(h2.frame(h2.SETTINGS, h2.ACK, 0))
        self._unblock()

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise h2.ProtocolError("PING on a stream")
        if len(payload) != 8:
            raise h2.ProtocolError("PING payload must be 8 bytes", h2.FRAME_SIZE_ERROR)
        self.abuse.control_frame("PING")
        if not flags & h2.ACK:
            self.write(h2.frame(h2.PING, h2.ACK, 0, payload))

    def _on_priority(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise h2.ProtocolError("PRIORITY on stream 0")
        if len(payload) != 5:
            raise h2.ProtocolError("PRIORITY payload must be 5 bytes", h2.FRAME_SIZE_ERROR)
        self.abuse.control_frame("PRIORITY")  # priorities are advisory: nothing else to do

    def _on_goaway(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise h2.ProtocolError("GOAWAY on a stream")
        if len(payload) < 8:
            raise h2.ProtocolError("GOAWAY payload too short", h2.FRAME_SIZE_ERROR)
        self.closing = True
        if not self.calls:
            self._close()

    def _on_window_update(self, flags: int, stream_id: int, payload: bytes) -> None:
        increment = h2.parse_u32(payload, "WINDOW_UPDATE")
        if increment < _SMALL_WINDOW_UPDATE:  # clients batch them; dribbling costs us frames
            self.abuse.control_frame("WINDOW_UPDATE of a few bytes (CVE-2019-9511)")
        if stream_id == 0:
            if not increment:
                raise h2.ProtocolError("WINDOW_UPDATE of 0 on the connection")
            self.send_window = grow_send_window(self.send_window, increment)
            self._unblock()
            return
        if stream_id > self.last_stream_id:
            raise h2.ProtocolError(f"WINDOW_UPDATE on idle stream {stream_id}")
        call = self.calls.get(stream_id)
        if call is None:
            return
        if not increment:
            self._reset(call, h2.PROTOCOL_ERROR)
        elif call.send_window + increment > h2.MAX_WINDOW_BYTES:
            self._reset(call, h2.FLOW_CONTROL_ERROR)
        else:
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

    # timers and lifecycle --------------------------------------------------------------------

    def _on_timer(self) -> None:
        """Preface deadline, then each abuse window and the idle check."""
        self._timer = None
        if self.transport is None:
            return
        limits = self.limits
        if not self._settled:
            log.info("closing a gRPC connection: no HTTP/2 preface and SETTINGS within %g s",
                     limits.h2_preface_timeout_s)
            self._close()
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now >= self._window_ends:
            self.abuse.new_window()
            self._window_ends = now + limits.h2_abuse_window_s
        wake_at = self._window_ends
        if not self.calls:
            idle_ends = self.idle_since + limits.h2_idle_timeout_s
            if now >= idle_ends:
                self.closing = True
                self.write(h2.goaway(self.last_stream_id, h2.NO_ERROR, b"idle"))
                self._flush()
                self._close()
                return
            wake_at = min(wake_at, idle_ends)
        else:
            wake_at = min(wake_at, now + limits.h2_idle_timeout_s)
        self._timer = loop.call_at(wake_at, self._on_timer)

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
        if exc.code == h2.ENHANCE_YOUR_CALM:
            peer = self.transport.get_extra_info("peername") if self.transport else None
            log.warning("closing gRPC connection from %s (GOAWAY ENHANCE_YOUR_CALM): %s",
                        peer, exc)
        else:
            log.info("closing a gRPC connection: %s", exc)
        self.closing = True
        self.write(h2.goaway(self.last_stream_id, exc.code, str(exc).encode()[:200]))
        self._flush()
        self._close()

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


_Handler = Callable[[GrpcConnection, int, int, bytes], None]
# plain functions, not bound methods: a table of bound methods would be a reference cycle
_HANDLERS: dict[int, _Handler] = {
    h2.DATA: GrpcConnection._on_data, h2.HEADERS: GrpcConnection._on_headers,
    h2.PRIORITY: GrpcConnection._on_priority, h2.RST_STREAM: GrpcConnection._on_rst_stream,
    h2.SETTINGS: GrpcConnection._on_settings, h2.PING: GrpcConnection._on_ping,
    h2.GOAWAY: GrpcConnection._on_goaway, h2.WINDOW_UPDATE: GrpcConnection._on_window_update,
    h2.PUSH_PROMISE: GrpcConnection._on_push_promise,
}
