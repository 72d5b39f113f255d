"""One gRPC client connection: its HTTP/2 streams as gRPC calls, over asyncio.

The HTTP/2 mechanics (framing, connection-level frames, timeouts, budgets, backpressure) are
framing.py's; here each HTTP/2 stream is a `ServerCall` (stream.py). A unary call starts when
its request is complete, after the whole read it arrived in (so a stream reset in that read
costs no work); a client-streaming call starts at its headers and reads messages as they arrive.

Bounds: at most h2_max_concurrent_streams open streams (beyond: REFUSED_STREAM, counted against
the reset budget); receive windows credited only as the calls consume their messages; every
received byte a call holds (its header list, its messages) counted against the server-wide
receive budget (past it: RESOURCE_EXHAUSTED); stream errors, client resets before an answer and
header lists over h2_max_header_list_bytes (that stream answered RESOURCE_EXHAUSTED) count
against h2_max_resets.

Conformance: a malformed request (http2/fields.py: names, values, pseudo-headers, TE,
connection-specific fields, a content-length its DATA does not meet) is reset with
PROTOCOL_ERROR; DATA on a closed stream gets STREAM_CLOSED, except DATA or trailers the client
sent before it learned the server had ended the stream (the last 256 such ids), dropped.

A request must keep arriving (nginx's client_body_timeout, which grpcio lacks): a unary call
whose request has not ended, or any call part-way through a message, that receives nothing for
body_timeout_s is ended with CANCELLED, and what it held is released; one stalled for
STALLED_REQUEST_S no longer keeps its connection from being evicted for a new one (as an
HTTP/1.1 connection stalled in a body). A streaming call that waits between whole messages is
not stalled: long-lived streams may be quiet.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from serval.http2 import frames as h2
from serval.http2.fields import check_request, trailers_problem
from serval.http2.flow import grow_send_window
from serval.http2.hpack import HeaderListTooLarge
from serval.protocol.grpc.status import GrpcStatus
from serval.server.grpc.framing import Http2Connection
from serval.server.grpc.stream import NO_OWN_HEADERS, CallFailed, ResponseHeaders, ServerCall
from serval.server.limits import TransportGuards

log = logging.getLogger(__name__)
_ENDED_EARLY_KEPT = 256  # stream ids remembered as ended by us before the client's end
STALLED_REQUEST_S = 1.0  # a request this long without a byte may be evicted for a new connection


class CallRunner(Protocol):
    """What runs a call once it may start (the service layer)."""

    def is_client_streaming(self, path: str) -> bool | None:
        """None: no such method."""

    def run(self, call: ServerCall) -> Coroutine[Any, Any, None]: ...


class GrpcConnection(Http2Connection):
    """The server side of one gRPC connection."""

    def __init__(self, runner: CallRunner, connections: set[GrpcConnection],
                 guards: TransportGuards,
                 response_headers: ResponseHeaders = NO_OWN_HEADERS) -> None:
        super().__init__(guards)
        self.runner, self.connections = runner, connections
        self.response_headers = response_headers
        self.calls: dict[int, ServerCall] = {}
        self.blocked: set[ServerCall] = set()
        self._starting: list[ServerCall] = []
        # streams the server ended before the client's END_STREAM, newest last: DATA or
        # trailers the client sent before it learned are dropped; on other closed streams they
        # are errors
        self._ended_early: dict[int, None] = {}
        self._checked: list[tuple[str, str]] | None = None  # the last well-formed request's
        self._checked_length = -1  # list (a cached block's comes back as the same list)
        self._backlogged = False  # counted in the server's send backlog

    def has_streams(self) -> bool:
        return bool(self.calls)

    def is_idle(self) -> bool:
        """No stream, or every stream a request that stalled (for the connection gate)."""
        if not self.calls:
            return True
        stalled_since = self._clock() - STALLED_REQUEST_S
        return all(_waits_on_client(call) and call.progress_at <= stalled_since
                   for call in self.calls.values())

    def _expire_stalled(self, now: float) -> float | None:
        timeout = self.limits.body_timeout_s
        next_end = None
        for call in list(self.calls.values()):
            if not _waits_on_client(call):
                continue
            ends = call.progress_at + timeout
            if now < ends:
                next_end = ends if next_end is None else min(next_end, ends)
                continue
            why = (f"the request stalled: nothing of it arrived for {timeout:g} s "
                   "(--body-timeout-s)")
            self.guards.abuse.closed("stalled gRPC request", why)
            call.abort(GrpcStatus.CANCELLED, why)
        return next_end

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.transport is not None:  # admitted by the connection gate
            self.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        for call in self.calls.values():
            call.close()  # the client is gone: drop its queued work
        self.calls.clear()
        self.blocked.clear()
        self._starting.clear()
        self.guards.backlog.resumed(self)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._note_backlog()

    def resume_writing(self) -> None:
        super().resume_writing()
        for call in list(self.calls.values()):
            call.wake_writer()
        self._note_backlog()

    def _fail(self, exc: h2.ProtocolError) -> None:
        self._starting.clear()
        super()._fail(exc)

    def _after_read(self) -> None:
        if self._starting:
            starting, self._starting = self._starting, []
            loop = asyncio.get_running_loop()
            for call in starting:
                if not call.finished and call.task is None:
                    call.task = loop.create_task(self.runner.run(call))

    # output (CallOwner) ----------------------------------------------------------------------

    def send_pending(self, call: ServerCall) -> None:
        """Write what the call may send now; remember it if flow control holds the rest."""
        frames, sent_bytes = call.take_sendable(self.send_window, self.peer_max_frame_bytes)
        self.send_window -= sent_bytes
        if sent_bytes and call in self.blocked:  # the client took some: progress
            self.sent_at = asyncio.get_running_loop().time()
        for data_frame in frames:
            self.write(data_frame)
        if call.has_output:
            if not self.blocked:
                self.send_stalled()
            self.blocked.add(call)
        else:
            self.blocked.discard(call)
            if call.finished:
                self._forget(call)
        if self.blocked or self._backlogged:
            self._note_backlog()

    def _note_backlog(self) -> None:
        """Replies waiting on the client (for window, or in the socket's buffer) past the
        write-buffer mark count in the server's send backlog (server/limits.py)."""
        unsent = sum(call.pending_bytes for call in self.blocked)
        if self.transport is not None:
            unsent += self.transport.get_write_buffer_size()
        self._backlogged = unsent > self.limits.write_buffer_bytes
        if self._backlogged:
            self.guards.backlog.hold(self, unsent, max(1, len(self.blocked)))
        else:
            self.guards.backlog.resumed(self)

    def consumed(self, call: ServerCall, size: int) -> None:
        """Credit bytes the server no longer holds to the connection and the stream windows."""
        self._consumed_by_connection(size)
        if not call.remote_closed:
            increment = call.window.consume(size)
            if increment:
                self.write(h2.window_update(call.stream_id, increment))

    def _unblock(self) -> None:
        for call in list(self.blocked):
            if self.send_window <= 0:
                return
            self.send_pending(call)

    def _forget(self, call: ServerCall) -> None:
        if self.calls.pop(call.stream_id, None) is None:
            return
        if not call.remote_closed:
            self.write(h2.rst_stream(call.stream_id, h2.NO_ERROR))  # we need no more of it
            self._end_early(call.stream_id)
        call.task = None  # done with it: no call <-> task cycle
        self._consumed_by_connection(call.release())
        if not self.calls:
            self.idle_since = asyncio.get_running_loop().time()
            self.guards.gate.touch(self)

    def _end_early(self, stream_id: int) -> None:
        ended = self._ended_early
        ended[stream_id] = None
        if len(ended) > _ENDED_EARLY_KEPT:
            del ended[next(iter(ended))]

    def _drop(self, call: ServerCall) -> None:
        """The stream is gone before its answer: stop the call, give back its credit."""
        self.calls.pop(call.stream_id, None)
        self.blocked.discard(call)
        self._consumed_by_connection(call.close())
        if self._backlogged:
            self._note_backlog()
        if not self.calls:
            self.idle_since = asyncio.get_running_loop().time()

    def _reset(self, call: ServerCall, code: int) -> None:
        """A stream error: RST_STREAM(code), the call dropped; counted like a client reset
        (a flood of invalid streams, CVE-2019-9514, costs the client its connection)."""
        self.write(h2.rst_stream(call.stream_id, code))
        if not call.remote_closed:
            self._end_early(call.stream_id)
        self._drop(call)
        self.abuse.reset_stream("ended by stream errors")

    # stream frames ---------------------------------------------------------------------------

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        size = len(payload)
        window = self.window  # InboundWindow.receive, inlined: this is the per-frame path
        window.available -= size
        if window.available < 0:
            raise h2.ProtocolError("DATA beyond the connection window", h2.FLOW_CONTROL_ERROR)
        if not size and not flags & h2.END_STREAM:
            self.abuse.control_frame("empty DATA")
        call = self.calls.get(stream_id)
        if call is None or call.remote_closed:
            if stream_id == 0 or stream_id > self.last_stream_id:
                raise h2.ProtocolError(f"DATA on idle stream {stream_id}")
            self._consumed_by_connection(size)
            if call is not None:
                self._reset(call, h2.STREAM_CLOSED)
            elif stream_id not in self._ended_early:  # closed by both sides, or its reset
                self.write(h2.rst_stream(stream_id, h2.STREAM_CLOSED))  # (RFC 9113 6.1)
                self.abuse.reset_stream("DATA on closed streams")
            return  # else: sent before the client learned we ended it: dropped
        window = call.window
        window.available -= size
        if window.available < 0:
            self._consumed_by_connection(size)
            self._reset(call, h2.FLOW_CONTROL_ERROR)
            return
        call.progress_at = self.read_at
        credit = 0
        if flags & h2.PADDED:
            content = h2.strip_padding(flags, payload)
            credit, payload = size - len(content), content
        if call.content_left >= 0:  # it announced a content-length (RFC 9113 8.1.1)
            left = call.content_left = call.content_left - len(payload)
            if left < 0 or (left and flags & h2.END_STREAM):
                self._consumed_by_connection(size)
                self._reset(call, h2.PROTOCOL_ERROR)
                return
        try:
            credit += call.receive(payload)
        except CallFailed as exc:
            self._consumed_by_connection(size)
            call.abort(exc.status, exc.message, exc.extra)  # then RST_STREAM(NO_ERROR)
            return
        if flags & h2.END_STREAM:
            self._end_remote(call)
        if credit:
            self.consumed(call, credit)

    def _on_header_block(self, flags: int, stream_id: int, block: bytes) -> None:
        too_large = None
        try:
            headers = self.decoder.decode(block)  # always: the HPACK table must stay in step
        except HeaderListTooLarge as exc:  # processed whole: refuse this stream, go on
            headers, too_large = [], str(exc)
            self.abuse.reset_stream("header list over SETTINGS_MAX_HEADER_LIST_SIZE")
        call = self.calls.get(stream_id)
        if call is not None:  # trailers from the client end its stream
            if too_large is not None:
                call.abort(GrpcStatus.RESOURCE_EXHAUSTED, too_large)
            elif call.remote_closed:
                self._reset(call, h2.STREAM_CLOSED)
            elif not flags & h2.END_STREAM or call.content_left > 0 or (
                    self.decoder.malformed or trailers_problem(headers)):
                self._reset(call, h2.PROTOCOL_ERROR)
            else:
                self._end_remote(call)
            return
        if stream_id in self._ended_early:  # its trailers, sent before the client learned
            return  # we ended it (decoded above: the HPACK table stays in step)
        if stream_id <= self.last_stream_id or not stream_id & 1:
            raise h2.ProtocolError(f"client opened stream {stream_id} after "
                                   f"{self.last_stream_id} (ids must be odd and increase)")
        self.last_stream_id = stream_id
        limits = self.limits
        if self.closing or len(self.calls) >= limits.h2_max_concurrent_streams:
            self.write(h2.rst_stream(stream_id, h2.REFUSED_STREAM))
            self._end_early(stream_id)
            if not self.closing:
                self.abuse.reset_stream("refused past SETTINGS_MAX_CONCURRENT_STREAMS")
            return
        content_length: int | None = -1
        if too_large is None:
            content_length = self._well_formed(stream_id, flags, headers)
            if content_length is None:
                return
        call = ServerCall(self, stream_id, headers, received_ns=time.perf_counter_ns(),
                          send_window=self.peer_window_bytes,
                          receive_window=limits.h2_stream_window_bytes,
                          max_message_bytes=limits.max_message_bytes,
                          max_messages=limits.h2_max_stream_messages, budget=self.guards.budget)
        call.content_left = -1 if content_length is None else content_length
        self.calls[stream_id] = call
        call.progress_at = self.read_at
        self.wake_by(self.read_at + limits.body_timeout_s)  # to see it if it stalls
        if too_large is None:
            try:
                call.hold(self.decoder.last_list_bytes)
            except CallFailed as exc:
                too_large = exc.message
        if too_large is not None:
            call.finish(GrpcStatus.RESOURCE_EXHAUSTED, too_large)
            if flags & h2.END_STREAM:
                self._end_remote(call)
        elif self._start(call) and flags & h2.END_STREAM:
            self._end_remote(call)

    def _well_formed(self, stream_id: int, flags: int, headers: list[tuple[str, str]]
                     ) -> int | None:
        """A new stream's content-length (-1: none), or None when its request is malformed
        (RFC 9113 8.1.1): then RST_STREAM(PROTOCOL_ERROR), counted like any stream error."""
        if headers is self._checked:  # (a cached block is never malformed)
            problem, length = None, self._checked_length
        else:
            problem, length = check_request(headers)
            problem = self.decoder.malformed or problem
        if problem is None and length > 0 and flags & h2.END_STREAM:
            problem = "content-length above 0 and no DATA"
        if problem is not None:
            log.info("refusing a malformed HTTP/2 request: %s", problem)
            self.write(h2.rst_stream(stream_id, h2.PROTOCOL_ERROR))
            self._end_early(stream_id)
            self.abuse.reset_stream("malformed (RFC 9113 8.1.1)")
            return None
        self._checked, self._checked_length = headers, length
        return length

    def _start(self, call: ServerCall) -> bool:
        """Check the call can run; client-streaming calls start now, unary ones at their end."""
        call.path = path = call.header(":path") or ""
        kind = call.header("content-type") or ""
        if not kind.startswith("application/grpc") or kind[16:17] not in ("", "+", ";"):
            call.reject(415)  # gRPC over HTTP/2 (not grpc-web, whose framing differs)
            return False
        if call.headers[0] != (":method", "POST") and call.header(":method") != "POST":
            call.reject(405, (("allow", "POST"),))  # as grpc-go
            return False
        streaming = self.runner.is_client_streaming(path)
        if streaming is None:
            call.finish(GrpcStatus.UNIMPLEMENTED, f"Method not found: {path}")
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

    def _on_rst_stream(self, flags: int, stream_id: int, payload: bytes) -> None:
        h2.parse_u32(payload, "RST_STREAM")
        if stream_id == 0 or stream_id > self.last_stream_id:
            raise h2.ProtocolError(f"RST_STREAM on idle stream {stream_id}")
        call = self.calls.get(stream_id)
        if call is None:
            return
        if not call.finished:
            self.abuse.reset_stream("reset by the client before their answer")
        self._drop(call)  # cancelled, or past its deadline

    def _waits_for_window(self, stream_id: int) -> bool:
        if not stream_id:
            return bool(self.blocked)
        call = self.calls.get(stream_id)
        return call is not None and call in self.blocked

    def _on_stream_window_update(self, stream_id: int, increment: int) -> None:
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

    def _on_initial_window_change(self, delta: int) -> None:
        for call in self.calls.values():
            call.send_window = grow_send_window(call.send_window, delta)


def _waits_on_client(call: ServerCall) -> bool:
    """The call cannot go on until the client sends more: a unary request not yet ended, or
    any call part-way through a message."""
    return not call.remote_closed and not call.finished and (
        call.task is None or call.assembling)
