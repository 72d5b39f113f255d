"""A lean HTTP/1.1 server for the v2 routes: httptools parsing, one write per response.

Each connection parses requests as bytes arrive and answers them in order (pipelined requests
wait their turn; an error found in a later request is queued behind the earlier answers). What a
client may take is bounded before it is buffered (serval.server.limits, `--max-*` flags):

- sizes: request target (414), request line and headers in bytes and count (431), body (413),
  counted as the bytes arrive; authorization (401/403) and whether the body fits the server-wide
  receive budget (429) are settled when the headers are complete, before any body is read or
  `100 Continue` sent (the budget then holds the body's bytes as they arrive);
- flow: a client that does not read its answers, or pipelines more than --max-pipelined
  requests ahead of them, is not read until it catches up (write buffer limits);
- time: headers, body pauses, idle keep-alive and a peer that stops reading are each bounded,
  all by one timer per connection (timer.py);
- room: every connection passes the server's ConnectionGate, which may evict an idle one.

A closed connection drops everything it holds (parser, queue, timer, task), so nothing waits for
the cycle collector.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import NoReturn, cast
from urllib.parse import unquote

import httptools

from serval.server.http.app import HttpApp, RawHeaders
from serval.server.http.timer import ConnectionTimer
from serval.server.http.wire import CONTINUE, Refusal, encode_reply, refusal
from serval.server.limits import TransportGuards

log = logging.getLogger(__name__)

_LINGER_S = 2.0
_STALLED_BODY_S = 1.0  # a body this long without a byte may be evicted for a new connection
_FULL = encode_reply((503, b'{"error":"the server is at its connection limit '
                            b'(--max-connections); retry shortly"}',
                      [(b"content-type", b"application/json")]), keep_alive=False)


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    headers: RawHeaders
    body: bytes
    keep_alive: bool
    query: str = ""
    reserved: int = 0  # bytes of the receive budget held until the answer is written


class _Refused(Exception):
    """Raised from a parser callback after queueing a refusal: stop parsing."""


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


class HttpProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, app: HttpApp, tracker: ConnectionTracker,
                 guards: TransportGuards) -> None:
        self.app, self.tracker = app, tracker
        self.guards, self.limits = guards, guards.limits
        self.max_body_bytes = guards.limits.max_request_bytes
        self.max_header_bytes = guards.limits.max_header_bytes
        self.max_pipelined = guards.limits.max_pipelined
        self.loop = asyncio.get_running_loop()
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.timer: ConnectionTimer | None = None
        self.pending: deque[_Request | Refusal] = deque()
        self.handler: asyncio.Task[None] | None = None
        self.drained: asyncio.Future[None] | None = None
        self.closing = False  # shutdown: finish the request in hand, then close
        self.peer_done = False  # the client half-closed: answer what it sent, then close
        self.refused = False  # a refusal is queued: parse nothing more
        self.reading_paused = self.write_paused = False
        self.write_paused_at = self.linger_until = 0.0
        self.reserved_total = 0  # receive budget held by this connection, all requests
        # phase: headers from connection open (first request) or first byte; then body
        self.in_headers, self.in_body, self.started = True, False, False
        self.last_read = self.header_started = self.idle_since = self.loop.time()
        self.progress = False  # a parser callback ran during the current feed
        self.stalled = 0  # bytes fed with no callback at all (inside one header or chunk line)
        self._reset_message()

    def _reset_message(self) -> None:
        self.url = b""
        self.headers: RawHeaders = []
        self.body: list[bytes] = []
        self.body_bytes = self.header_bytes = self.reserved = 0
        self.content_length = -1  # -1: none given
        self.chunked = self.expect_continue = self.continue_owed = False
        self.method, self.path, self.query = "", "", ""

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        if not self.guards.gate.admit(self):
            transport.write(_FULL)
            transport.close()
            return
        self.tracker.connections.add(self)
        transport.set_write_buffer_limits(high=self.limits.write_buffer_bytes)
        period = min(self.limits.header_timeout_s, self.limits.body_timeout_s,
                     self.limits.keepalive_timeout_s)
        self.timer = ConnectionTimer(self.loop, period, self._check_deadlines)

    def data_received(self, data: bytes) -> None:
        self.last_read = self.loop.time()
        if self.refused or self.parser is None:
            return  # refused: read and drop what the client still sends (lingering close)
        step = self.max_header_bytes
        if len(data) <= step:
            self._feed(data)
        else:  # in slices: a header never grows more than one slice past its limit
            view = memoryview(data)
            for start in range(0, len(data), step):
                self._feed(view[start:start + step])
                if self.refused:
                    break
        if self.reading_paused or len(self.pending) >= self.max_pipelined:
            self._update_reading()

    def eof_received(self) -> bool | None:
        if self.pending or self.handler is not None:
            self.peer_done = True  # answer what it sent, then close
            return True
        return None

    def pause_writing(self) -> None:
        self.write_paused, self.write_paused_at = True, self.loop.time()
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._update_reading()
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.guards.gate.release(self)
        self.tracker.connections.discard(self)
        if self.timer is not None:
            self.timer.stop()
        if self.reserved_total:
            self.guards.budget.release(self.reserved_total)
        if self.handler is not None and not self.handler.done():
            self.handler.cancel()  # the client is gone: drop its queued work
        # Break every cycle now (parser <-> callbacks, timer, task): freed without a GC pass.
        self.reserved_total = 0
        self.parser = self.transport = self.timer = self.drained = None
        self.pending.clear()
        self._reset_message()

    # httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.progress = self.started = True
        self._reset_message()
        if not self.in_headers:  # the first request's clock runs from connection open
            self.in_headers, self.header_started = True, self.last_read

    def on_url(self, url: bytes) -> None:
        self.progress = True
        self.url += url
        self.header_bytes += len(url)
        if len(self.url) > self.limits.max_url_bytes:
            self._abort(414, f"request target longer than this server's limit of "
                             f"{self.limits.max_url_bytes} bytes (--max-url-bytes)")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.progress = True
        name = name.lower()
        self.headers.append((name, value))
        self.header_bytes += len(name) + len(value) + 4
        if len(self.headers) > self.limits.max_header_count:
            self._abort(431, f"more than {self.limits.max_header_count} header fields "
                             "(--max-header-count)")
        if self.header_bytes > self.max_header_bytes:
            self._refuse(self._header_too_large(), "header limit")
            raise _Refused
        if name == b"content-length":
            self.content_length = int(value) if value.strip().isdigit() else -1
        elif name == b"transfer-encoding":
            self.chunked = True
        elif name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True

    def on_headers_complete(self) -> None:
        self.progress, self.in_headers, self.in_body = True, False, True
        assert self.parser is not None
        try:
            url = httptools.parse_url(self.url)
        except httptools.HttpParserError:
            self._abort(400, "malformed HTTP request: invalid request target")
        self.method = self.parser.get_method().decode("latin-1")
        self.path = unquote(url.path.decode("latin-1"))
        self.query = url.query.decode("latin-1") if url.query else ""
        if self.content_length > 0 or self.chunked:
            self._admit_body()

    def on_body(self, body: bytes) -> None:
        self.progress = True
        self.body_bytes += len(body)
        if self.body_bytes > self.reserved:  # the budget holds what has arrived
            self._check_body_size(self.body_bytes)
            self._reserve(self.body_bytes - self.reserved)
        self.body.append(body)

    def on_chunk_header(self) -> None:
        self.progress = True

    def on_chunk_complete(self) -> None:
        self.progress = True

    def on_message_complete(self) -> None:
        assert self.parser is not None
        self.progress, self.in_body, self.started = True, False, False
        self.continue_owed = False
        request = _Request(self.method, self.path, self.headers, b"".join(self.body),
                           self.parser.should_keep_alive(), self.query, self.reserved)
        self.reserved = 0  # the request holds it now
        self.body = []
        self.pending.append(request)
        if self.handler is None:
            self.handler = self.loop.create_task(self._serve_pending())

    # limits ----------------------------------------------------------------------------------

    def _feed(self, data: bytes | memoryview) -> None:
        assert self.parser is not None
        self.progress = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._upgrade_refused()
            return
        except httptools.HttpParserError as exc:
            if not self.refused:
                self._refuse(refusal(400, f"malformed HTTP request: {exc}"), "malformed")
            return
        if self.progress:
            self.stalled = 0
            return
        self.stalled += len(data)  # all of it inside one header line (or chunk framing)
        if self.in_headers and self.header_bytes + self.stalled > self.max_header_bytes:
            self._refuse(self._header_too_large(), "header limit")
        elif self.stalled > self.max_header_bytes:
            self._refuse(refusal(400, f"chunk framing or trailer line longer than "
                                      f"{self.max_header_bytes} bytes"), "malformed")

    def _header_too_large(self) -> Refusal:
        return refusal(431, f"request line and headers longer than this server's limit of "
                            f"{self.max_header_bytes} bytes (--max-header-bytes)")

    def _admit_body(self) -> None:
        """At the end of the headers: authorization, size and budget, then `100 Continue`."""
        denied = self.app.precheck(self.method, self.path, self.headers)
        if denied is not None:
            self._refuse(Refusal(denied))
            raise _Refused
        self._check_body_size(self.content_length)
        if self.content_length > 0 and not self.guards.budget.fits(self.content_length):
            self._refuse(self._over_budget(self.content_length))
            raise _Refused
        if self.expect_continue and self.parser is not None \
                and self.parser.get_http_version() != "1.0":
            if self.pending or self.handler is not None:
                self.continue_owed = True  # a 1xx belongs to the request being answered
            elif self.transport is not None:
                self.transport.write(CONTINUE)

    def _check_body_size(self, size_bytes: int) -> None:
        """413 before reading more than --max-request-mb (chunked bodies included)."""
        if size_bytes > self.max_body_bytes:
            self._abort(413, f"request body of {size_bytes} bytes is larger than this server's "
                             f"limit of {self.max_body_bytes} bytes (--max-request-mb)")

    def _reserve(self, size_bytes: int) -> None:
        if not self.guards.budget.reserve(size_bytes):
            self._refuse(self._over_budget(max(self.content_length, self.body_bytes)))
            raise _Refused
        self.reserved += size_bytes
        self.reserved_total += size_bytes

    def _over_budget(self, size_bytes: int) -> Refusal:
        return refusal(429, self.guards.budget.refusal_message(size_bytes),
                       [(b"retry-after", b"1")])

    def _release(self, size_bytes: int) -> None:
        size_bytes = min(size_bytes, self.reserved_total)
        if size_bytes:
            self.reserved_total -= size_bytes
            self.guards.budget.release(size_bytes)

    def _abort(self, status: int, message: str) -> NoReturn:
        self._refuse(refusal(status, message), "request limit" if status != 400 else "")
        raise _Refused

    def _refuse(self, answer: Refusal, abuse: str = "") -> None:
        """Queue `answer` behind the requests already read; parse nothing more."""
        if self.refused:
            return
        self.refused = True
        self._release(self.reserved)  # the request being read is dropped
        self.reserved, self.body = 0, []
        if abuse:
            self.guards.abuse.closed(abuse, f"HTTP/1.1 {answer.reply[0]}: {answer.message}")
        self.pending.append(answer)
        if self.handler is None:
            self.handler = self.loop.create_task(self._serve_pending())
        if self.reading_paused:
            self._update_reading()

    def _upgrade_refused(self) -> None:
        """Upgrade or CONNECT: answer the request as plain HTTP/1.1 (RFC 9110 lets a server
        ignore Upgrade), then close; nothing after it is parsed."""
        self.refused = True
        last = self.pending[-1] if self.pending else None
        if isinstance(last, _Request):
            last.keep_alive = False
        else:
            self.refused = False
            self._refuse(refusal(400, "protocol upgrades are not supported"))

    def _update_reading(self) -> None:
        """Read only while the client reads its answers and is not too far ahead of them."""
        transport = self.transport
        if transport is None:
            return
        pause = self.write_paused or (len(self.pending) >= self.max_pipelined
                                      and not self.refused)
        if pause == self.reading_paused:
            return
        self.reading_paused = pause
        if pause:
            transport.pause_reading()
            return
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
                reply = await self.app.handle(item.method, item.path, item.headers,
                                              item.body, item.query)
                if self.transport is None:
                    return
                keep_alive = item.keep_alive and not self.closing
                self.transport.write(encode_reply(reply, keep_alive, item.method == "HEAD"))
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
            if self.continue_owed and self.transport is not None and not self.refused:
                self.continue_owed = False
                self.transport.write(CONTINUE)

    def _send_refusal(self, answer: Refusal) -> None:
        transport = self.transport
        assert transport is not None
        self.pending.clear()
        transport.write(encode_reply(answer.reply, keep_alive=False))
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
        if self.transport is not None:
            self.transport.abort()

    def close_when_idle(self) -> None:
        """Finish the request in hand (if any), then close."""
        self.closing = True
        if self.handler is None and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
