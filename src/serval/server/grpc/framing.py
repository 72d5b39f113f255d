"""The HTTP/2 side of a server connection: framing, connection-level frames and guards.

`Http2Connection` is what every HTTP/2 server connection does whatever its streams carry: the
preface and SETTINGS exchange (within h2_preface_timeout_s), frame dispatch, header blocks
(assembled and capped by http2/blocks.py), PING, PRIORITY, GOAWAY and WINDOW_UPDATE, the receive
window of the connection, batched output, write backpressure (reading stops while the client
does not read), the abuse budgets, the idle timeout and the send timeout. Streams are the subclass's
(connection.py): it handles DATA, complete header blocks and RST_STREAM.

Handlers are looked up in a per-class table of plain functions (not bound methods, which would
make a reference cycle through the connection).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import ClassVar, cast

from serval.http2 import frames as h2
from serval.http2.abuse import AbuseBudget
from serval.http2.blocks import HeaderBlocks
from serval.http2.flow import InboundWindow, grow_send_window
from serval.http2.hpack import HpackDecoder
from serval.server.limits import TransportGuards
from serval.server.listen import linger

log = logging.getLogger(__name__)

_MAX_RECEIVED_FRAME_BYTES = 1024 * 1024
_READ_SLICE_BYTES = 64 * 1024  # then one loop turn for everyone else (libuv reads up to 8 MiB)
_SMALL_WINDOW_UPDATE = 1024  # increments below this count as control frames
_LINGER_S = 1.0  # after a GOAWAY for abuse: what the peer still sends is read and dropped

Handler = Callable[["Http2Connection", int, int, bytes], None]


class Http2Connection(asyncio.Protocol):
    """The server side of one HTTP/2 connection, without its streams."""

    handlers: ClassVar[dict[int, Handler]] = {}
    _HANDLER_NAMES: ClassVar[dict[int, str]] = {
        h2.DATA: "_on_data", h2.HEADERS: "_on_headers", h2.PRIORITY: "_on_priority",
        h2.RST_STREAM: "_on_rst_stream", h2.SETTINGS: "_on_settings", h2.PING: "_on_ping",
        h2.GOAWAY: "_on_goaway", h2.WINDOW_UPDATE: "_on_window_update",
        h2.PUSH_PROMISE: "_on_push_promise",
    }

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        cls.handlers = {kind: getattr(cls, name) for kind, name in cls._HANDLER_NAMES.items()}

    def __init__(self, guards: TransportGuards) -> None:
        self.guards, self.limits = guards, guards.limits
        limits = guards.limits
        self.transport: asyncio.Transport | None = None
        self.last_stream_id = 0
        self.decoder = HpackDecoder(max_list_bytes=limits.h2_max_header_list_bytes)
        self.max_frame_bytes = max(h2.DEFAULT_MAX_FRAME_BYTES,
                                   min(_MAX_RECEIVED_FRAME_BYTES, limits.h2_stream_window_bytes))
        self.reader = h2.FrameReader(self.max_frame_bytes)
        self.window = InboundWindow(limits.h2_connection_window_bytes)
        self.abuse = AbuseBudget(limits.h2_max_control_frames, limits.h2_max_resets)
        self.blocks = HeaderBlocks(2 * limits.h2_max_header_list_bytes, self.abuse)
        self.peer_window_bytes = h2.DEFAULT_WINDOW_BYTES  # the peer's initial stream window
        self.peer_max_frame_bytes = h2.DEFAULT_MAX_FRAME_BYTES
        self.send_window = h2.DEFAULT_WINDOW_BYTES
        self.closing = False
        self.write_paused = False
        self.idle_since = 0.0
        self.read_at = 0.0  # loop time of the last read from the client
        self.sent_at = 0.0  # the last progress of output that waits on the client
        self._preface: bytes | None = b""
        self._settled = False  # the client's first SETTINGS arrived
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._window_ends = 0.0
        self._read_bytes = 0
        self._linger_on_close = False  # closing for abuse: let the peer read the GOAWAY
        self._linger: asyncio.TimerHandle | None = None
        self._clock: Callable[[], float] = time.monotonic  # the loop's, once connected

    # what the streams' side provides ---------------------------------------------------------

    def has_streams(self) -> bool:
        raise NotImplementedError

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        raise NotImplementedError

    def _on_header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        """A complete header block (HEADERS and its CONTINUATIONs), not yet decoded."""
        raise NotImplementedError

    def _on_rst_stream(self, flags: int, stream_id: int, payload: bytes) -> None:
        raise NotImplementedError

    def _on_stream_window_update(self, stream_id: int, increment: int) -> None:
        raise NotImplementedError

    def _waits_for_window(self, stream_id: int) -> bool:
        """Data is held for want of window on this stream (0: on any stream)."""
        raise NotImplementedError

    def _on_initial_window_change(self, delta: int) -> None:
        raise NotImplementedError

    def _unblock(self) -> None:
        """The connection's send window grew: send what waited for it."""
        raise NotImplementedError

    def _after_read(self) -> None:
        """Every frame of one read has been handled."""

    def _expire_stalled(self, now: float) -> float | None:
        """End the streams whose request stalled; when the next one would (None: none)."""
        return None

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if not self.guards.gate.admit(self):
            self.transport.abort()
            self.transport = None
            return
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
        self._clock = loop.time
        self.idle_since = self.read_at = loop.time()
        self._window_ends = self.idle_since + limits.h2_abuse_window_s
        self._timer = loop.call_later(limits.h2_preface_timeout_s, self._on_timer)

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:  # closing: dropped unread
            return
        self.read_at = self._clock()
        self._read_bytes += len(data)
        if self._read_bytes > _READ_SLICE_BYTES:
            self._yield_reading()
        if self._preface is not None:
            data = self._check_preface(data)
            if not data:
                return
        handlers = self.handlers
        try:
            for kind, flags, stream_id, payload in self.reader.feed(data):
                if self.blocks.open is not None:
                    block = self.blocks.continuation(kind, flags, stream_id, payload)
                    if block is not None:
                        self._on_header_block(*block)
                    continue
                if not self._settled:
                    if kind != h2.SETTINGS or flags & h2.ACK:
                        raise h2.ProtocolError("the client preface must start with SETTINGS")
                    self._settled = True
                handler = handlers.get(kind)
                if handler is not None:
                    handler(self, flags, stream_id, payload)
                elif kind == h2.CONTINUATION:
                    raise h2.ProtocolError("CONTINUATION without HEADERS")
                else:
                    self.abuse.control_frame("unknown frame type")  # ignored, but counted
        except h2.ProtocolError as exc:
            self._fail(exc)
            return
        self._after_read()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guards.gate.release(self)
        self._out.clear()
        for timer in (self._timer, self._linger):
            if timer is not None:
                timer.cancel()
        self._timer = self._linger = None
        self.transport = None

    def pause_writing(self) -> None:
        """The client does not read what we write: stop reading what it sends."""
        self.write_paused = True
        self.send_stalled()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.sent_at = asyncio.get_running_loop().time()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

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

    # the connection gate ---------------------------------------------------------------------

    def is_idle(self) -> bool:
        return not self.has_streams()

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
        if self.transport is not None and not self.transport.is_closing() and (
                self._linger is None):
            self.transport.write(b"".join(out))
        if self.closing and not self.has_streams():
            self._close()

    def _consumed_by_connection(self, size: int) -> None:
        increment = self.window.consume(size)
        if increment:
            self.write(h2.window_update(0, increment))

    # connection-level frames -----------------------------------------------------------------

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

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        block = self.blocks.headers(flags, stream_id, payload)
        if block is not None:
            self._on_header_block(*block)

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
            self._on_initial_window_change(delta)
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
        h2.check_dependency(payload, stream_id)
        self.abuse.control_frame("PRIORITY")  # priorities are advisory: nothing else to do

    def _on_goaway(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise h2.ProtocolError("GOAWAY on a stream")
        if len(payload) < 8:
            raise h2.ProtocolError("GOAWAY payload too short", h2.FRAME_SIZE_ERROR)
        self.closing = True
        if not self.has_streams():
            self._close()

    def _on_window_update(self, flags: int, stream_id: int, payload: bytes) -> None:
        increment = h2.parse_u32(payload, "WINDOW_UPDATE")
        if increment < _SMALL_WINDOW_UPDATE and self._waits_for_window(stream_id):
            # a few bytes of credit for data we hold: dribbling makes us cut tiny frames
            # (grpc-core credits each small message it reads: harmless when nothing waits)
            self.abuse.control_frame("WINDOW_UPDATE of a few bytes (CVE-2019-9511)")
        if stream_id == 0:
            if not increment:
                raise h2.ProtocolError("WINDOW_UPDATE of 0 on the connection")
            self.send_window = grow_send_window(self.send_window, increment)
            self._unblock()
            return
        if stream_id > self.last_stream_id:
            raise h2.ProtocolError(f"WINDOW_UPDATE on idle stream {stream_id}")
        self._on_stream_window_update(stream_id, increment)

    def _on_push_promise(self, flags: int, stream_id: int, payload: bytes) -> None:
        raise h2.ProtocolError("clients must not push")

    # timers and lifecycle --------------------------------------------------------------------

    def _on_timer(self) -> None:
        """Preface deadline, then each abuse window and the idle check."""
        self._timer = None
        if self.transport is None:
            return
        limits = self.limits
        if not self._settled:
            log.info("closing an HTTP/2 connection: no preface and SETTINGS within %g s",
                     limits.h2_preface_timeout_s)
            self._close()
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if now >= self._window_ends:
            self.abuse.new_window()
            self._window_ends = now + limits.h2_abuse_window_s
        wake_at = self._window_ends
        if self.write_paused or self._waits_for_window(0):
            stall_ends = self.sent_at + limits.h2_send_timeout_s
            if now >= stall_ends:
                self.guards.abuse.closed("write stall", "an HTTP/2 client took none of its "
                                         f"answers for {limits.h2_send_timeout_s:g} s "
                                         "(--h2-send-timeout-s)")
                self.abort()
                return
            wake_at = min(wake_at, stall_ends)
        if not self.has_streams():
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
            stalled_ends = self._expire_stalled(now)
            if stalled_ends is not None:
                wake_at = min(wake_at, stalled_ends)
        self._timer = loop.call_at(wake_at, self._on_timer)

    def wake_by(self, at: float) -> None:
        """Run the timer by loop time `at` at the latest (a stream's stall deadline)."""
        timer = self._timer
        if timer is not None and timer.when() > at:
            timer.cancel()
            self._timer = asyncio.get_running_loop().call_at(at, self._on_timer)

    def send_stalled(self) -> None:
        """Output began to wait on the client (flow-control window or socket): from now it has
        h2_send_timeout_s to take some, or the connection is closed."""
        loop = asyncio.get_running_loop()
        self.sent_at = now = loop.time()
        ends = now + self.limits.h2_send_timeout_s
        if self._timer is not None and self._timer.when() > ends:
            self._timer.cancel()
            self._timer = loop.call_at(ends, self._on_timer)

    def shut_down(self) -> None:
        """Refuse new streams (GOAWAY), finish the open ones, then close."""
        if self.transport is None:
            return
        self.closing = True
        self.write(h2.goaway(self.last_stream_id, h2.NO_ERROR))
        if not self.has_streams():
            self._flush()
            self._close()

    def _fail(self, exc: h2.ProtocolError) -> None:
        if exc.code == h2.ENHANCE_YOUR_CALM:  # counted; one warning line per interval
            peer = self.transport.get_extra_info("peername") if self.transport else None
            self.guards.abuse.closed("http2 flood", f"GOAWAY ENHANCE_YOUR_CALM to {peer}: {exc}")
        else:
            log.info("closing an HTTP/2 connection: %s", exc)
        self.closing = True
        self._linger_on_close = True
        self.write(h2.goaway(self.last_stream_id, exc.code, str(exc).encode()[:200]))
        self._flush()
        self._close()

    def _close(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing() or self._linger is not None:
            return
        if self._linger_on_close:  # a peer still sending would get a reset, not the GOAWAY
            self._linger = linger(transport, _LINGER_S)
            if self._linger is not None:
                return
        transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
