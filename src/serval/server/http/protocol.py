"""A lean HTTP/1.1 server for the v2 routes: httptools parsing, one write per response.

Each connection parses requests as bytes arrive and answers them in order (pipelined requests
wait their turn; an error found in a later request is queued behind the earlier answers). What a
client may take is bounded before it is buffered (serval.server.limits, `--max-*` flags):

- sizes (414, 431, 413), authorization (401/403) and the receive budget (429): reader.py,
  counted as the bytes arrive and settled before a body is read or `100 Continue` sent;
- flow: a client that does not read its answers, or pipelines more than --max-pipelined
  requests ahead of them, is not read until it catches up (write buffer limits);
- time: headers, body pauses, idle keep-alive and a peer that stops reading are each bounded,
  all by one timer per connection (timer.py);
- room: every connection passes the server's ConnectionGate, which may evict an idle one;
- retries: a request for a model this connection was just told to wait for (Retry-After) is
  refused when that elapses, unread (holds.py).

A closed connection drops everything it holds (parser, queue, timer, task), so nothing waits for
the cycle collector.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import cast

from serval.server.http.app import Routes
from serval.server.http.errors import Reply
from serval.server.http.holds import RetryHolds, too_early
from serval.server.http.reader import Request, RequestReader
from serval.server.http.streamed import StreamedReply
from serval.server.http.timer import ConnectionTimer
from serval.server.http.wire import (
    CONTINUE,
    LAST_CHUNK,
    NO_SERVER_HEADERS,
    Refusal,
    ServerHeaders,
    encode_chunk,
    encode_reply,
    encode_stream_head,
    refusal,
)
from serval.server.limits import TransportGuards

log = logging.getLogger(__name__)

_LINGER_S = 2.0
_STALLED_BODY_S = 1.0  # a body this long without a byte may be evicted for a new connection


@dataclass
class ConnectionTracker:
    """The server's open connections, so shutdown can finish in-flight work and close idle ones."""

    connections: set[HttpProtocol] = field(default_factory=set)

    async def shutdown(self, timeout_s: float) -> None:
        for connection in list(self.connections):
            connection.close_when_idle()
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            connection.abort()


class HttpProtocol(RequestReader):
    """One client connection: requests in (reader.py), answers out in order."""

    def __init__(self, app: Routes, tracker: ConnectionTracker, guards: TransportGuards,
                 server_headers: ServerHeaders = NO_SERVER_HEADERS) -> None:
        super().__init__(app, guards)
        self.tracker = tracker
        self.server_headers = server_headers
        self.server_lines = server_headers.lines  # on every answer (serval-node)
        self.max_pipelined = guards.limits.max_pipelined
        self.transport: asyncio.Transport | None = None
        self.timer: ConnectionTimer | None = None
        self.pending: deque[Request | Refusal] = deque()
        self.handler: asyncio.Task[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.closing = False  # shutdown: finish the request in hand, then close
        self.peer_done = False  # the client half-closed: answer what it sent, then close
        self.reading_paused = self.write_paused = False
        self.write_paused_at = self.linger_until = 0.0
        self.idle_since = self.last_read
        self.holds = RetryHolds()  # the models this connection was told to wait for

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        if not self.guards.gate.admit(self):
            transport.write(self.server_headers.at_limit)
            transport.close()
            return
        self.tracker.connections.add(self)
        transport.set_write_buffer_limits(high=self.limits.write_buffer_bytes)
        period = min(self.limits.header_timeout_s, self.limits.body_timeout_s,
                     self.limits.keepalive_timeout_s)
        self.timer = ConnectionTimer(self.loop, period, self._check_deadlines)

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        self._receive(data)
        if self.reading_paused or len(self.pending) >= self.max_pipelined:
            self._update_reading()

    def eof_received(self) -> bool | None:
        if self.pending or self.handler is not None:
            self.peer_done = True  # answer what it sent, then close
            return True
        return None

    def pause_writing(self) -> None:
        self.write_paused, self.write_paused_at = True, self.loop.time()
        if self.transport is not None:
            self.guards.backlog.hold(self, self.transport.get_write_buffer_size())
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.guards.backlog.resumed(self)
        self._update_reading()
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.guards.gate.release(self)
        self.guards.backlog.resumed(self)
        self.tracker.connections.discard(self)
        if self.timer is not None:
            self.timer.stop()
        if self.reserved_total:
            self.guards.budget.release(self.reserved_total)
        if self.handler is not None and not self.handler.done():
            self.handler.cancel()  # the client is gone: drop its queued work
        # Break every cycle now (parser <-> callbacks, timer, task): freed without a GC pass.
        self.reserved_total = 0
        self.parser = self.transport = self.timer = self.drained = self.unparsed = None
        self.pending.clear()
        self._reset_message()

    # the reader's hooks ----------------------------------------------------------------------

    def _enqueue(self, item: Request | Refusal) -> None:
        self.pending.append(item)
        if self.handler is None:
            self.handler = self.loop.create_task(self._serve_pending())
        if self.reading_paused and isinstance(item, Refusal):
            self._update_reading()  # read and drop what the client still sends

    def _answering(self) -> bool:
        return bool(self.pending) or self.handler is not None

    def _last_queued(self) -> Request | Refusal | None:
        return self.pending[-1] if self.pending else None

    def _send_continue(self) -> None:
        if self.transport is not None:
            self.transport.write(CONTINUE)

    def _read_ahead_full(self) -> bool:
        return len(self.pending) >= self.max_pipelined

    # flow ------------------------------------------------------------------------------------

    def _update_reading(self) -> None:
        """Read only while the client reads its answers and is not too far ahead of them:
        pause at --max-pipelined waiting requests, go on at half (what was read and kept back
        is parsed first, without touching the socket)."""
        transport = self.transport
        if transport is None:
            return
        if not self.reading_paused:
            if self.write_paused or (self._read_ahead_full() and not self.refused):
                self.reading_paused = True
                transport.pause_reading()
            return
        if self.write_paused or (len(self.pending) > self.max_pipelined // 2
                                 and not self.refused):
            return
        if self.unparsed is not None:
            self._resume_parsing()
            if self._read_ahead_full() and not self.refused:
                return  # still far enough ahead
        self.reading_paused = False
        transport.resume_reading()
        self.last_read = self.loop.time()  # its clocks start again: it could not send
        if self.in_headers:
            self.header_started = self.last_read

    # timeouts --------------------------------------------------------------------------------

    def _check_deadlines(self, now: float) -> float | None:
        """The connection timer's question: act on what has expired, say what expires next."""
        transport, limits = self.transport, self.limits
        if transport is None:
            return None
        if self.linger_until:
            if now < self.linger_until:
                return self.linger_until
            if transport.get_write_buffer_size():
                transport.abort()
            else:
                transport.close()
            return None
        if self.write_paused:
            deadline = self.write_paused_at + limits.body_timeout_s
            if now < deadline:
                return deadline
            self.guards.abuse.closed("write stall", "an HTTP/1.1 client read none of its "
                                     f"answers for {limits.body_timeout_s:g} s (--body-timeout-s)")
            transport.abort()
            return None
        if self.refused or self.reading_paused or self.pending or self.handler is not None:
            return math.inf  # answering: the application has its own deadlines
        if self.in_headers:
            deadline = self.header_started + limits.header_timeout_s
            if now >= deadline:
                if not self.started and not self.stalled:
                    transport.close()  # not a byte of a request: just close
                    return None
                self._refuse(refusal(408, "request headers not received within "
                                          f"{limits.header_timeout_s:g} s (--header-timeout-s)",
                                     linger=False), "header timeout")
                return math.inf
            return deadline
        if self.in_body:
            deadline = self.last_read + limits.body_timeout_s
            if now >= deadline:
                self._refuse(refusal(408, "request body paused for more than "
                                          f"{limits.body_timeout_s:g} s (--body-timeout-s)",
                                     linger=False), "body timeout")
                return math.inf
            return deadline
        deadline = max(self.idle_since, self.last_read) + limits.keepalive_timeout_s
        if now < deadline:
            return deadline
        transport.close()
        return None

    # answering -------------------------------------------------------------------------------

    async def _serve_pending(self) -> None:
        served = 0
        try:
            while self.pending and self.transport is not None:
                item = self.pending.popleft()
                if self.reading_paused:
                    self._update_reading()
                if isinstance(item, Refusal):
                    self._send_refusal(item)
                    return
                early = (self.holds.wait_s(item.path, self.loop.time()) if self.holds.held
                         else None)  # (no clock read per request while nothing is held)
                reply: Reply | StreamedReply
                if early is not None:  # a client ignoring Retry-After: no work for it
                    await asyncio.sleep(early[0])
                    reply = too_early(item.path, early[1])
                else:
                    reply = await self.app.handle(item.method, item.path, item.headers,
                                                  item.body, item.query, item.authorized)
                if self.transport is None:
                    if isinstance(reply, StreamedReply):
                        await reply.rest.aclose()
                    return
                keep_alive = item.keep_alive and not self.closing
                if isinstance(reply, StreamedReply):
                    keep_alive = keep_alive and not item.http10  # 1.0: ends at the close
                    if not await self._stream(reply, keep_alive, not item.http10, item.head):
                        return  # the client went away mid-answer
                else:
                    if reply[0] in (429, 503):
                        self.holds.note(item.path, reply[2], self.loop.time())
                    self.transport.write(encode_reply(reply, keep_alive, item.head,
                                                      self.server_lines, item.http10))
                if item.reserved:
                    self._release(item.reserved)
                if not keep_alive:
                    self.transport.close()
                    return
                served += 1
                if self.write_paused:
                    self.drained = self.loop.create_future()
                    await self.drained
                    self.drained = None
                elif served % self.max_pipelined == 0:
                    await asyncio.sleep(0)  # a long pipeline must not starve other clients
            if self.peer_done and self.transport is not None:
                self.transport.close()
        finally:
            self.handler = None
            self.idle_since = self.loop.time()
            self.guards.gate.touch(self)
            if self.continue_owed and not self.refused:
                self.continue_owed = False
                self._send_continue()

    async def _stream(self, reply: StreamedReply, keep_alive: bool, chunked: bool,
                      head: bool = False) -> bool:
        """Write an answer as its pieces come (chunked, or as is to an HTTP/1.0 client, which
        the close then ends), no faster than the client reads; False when the connection
        closed first (the pieces' maker is stopped). `head`: the head alone (HEAD)."""
        async with contextlib.aclosing(reply.rest) as rest:
            assert self.transport is not None
            self.transport.write(encode_stream_head(reply.status, reply.headers, keep_alive,
                                                    self.server_lines, chunked))
            if head:
                return True
            data = reply.first
            while True:
                if self.transport is None:
                    return False
                if data:
                    self.transport.write(encode_chunk(data) if chunked else data)
                if self.write_paused:
                    self.drained = self.loop.create_future()
                    await self.drained
                    self.drained = None
                try:
                    data = await anext(rest)
                except StopAsyncIteration:
                    break
        if self.transport is None:
            return False
        if chunked:
            self.transport.write(LAST_CHUNK)
        return True

    def _send_refusal(self, answer: Refusal) -> None:
        transport = self.transport
        assert transport is not None
        self.pending.clear()
        transport.write(encode_reply(answer.reply, keep_alive=False,
                                     server_lines=self.server_lines))
        if not answer.linger:
            transport.close()
            return
        # Lingering close: a client still sending would get a reset, not the answer, if we
        # closed with its data unread; stop writing, drop what arrives, close soon.
        if transport.can_write_eof():
            transport.write_eof()
        self.linger_until = self.loop.time() + _LINGER_S
        if self.timer is not None:
            self.timer.fire_by(self.linger_until)

    # lifecycle -------------------------------------------------------------------------------

    def is_idle(self) -> bool:
        """No request in hand: idle keep-alive, still sending a request's headers, or stalled
        in a body (nothing for _STALLED_BODY_S: a slow-POST attacker must not hold the room)."""
        if self.pending or self.handler is not None:
            return False
        return not self.in_body or self.loop.time() - self.last_read >= _STALLED_BODY_S

    def evict(self) -> None:
        """The connection gate needs the room: close now."""
        self.abort()

    def close_when_idle(self) -> None:
        """Finish the request in hand (if any), then close."""
        self.closing = True
        if self.handler is None and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Close now, dropping what is unsent (the gate, the send backlog, shutdown)."""
        if self.transport is not None:
            self.transport.abort()

