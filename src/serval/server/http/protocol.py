"""A lean HTTP/1.1 server for the v2 routes: httptools parsing, one write per response.

Each connection parses requests as bytes arrive and answers them in order (pipelined requests
wait their turn). A client that disconnects cancels its request, which frees its queue slot.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import cast
from urllib.parse import unquote

import httptools

from serval.server.http.app import HttpApp, RawHeaders, Reply
from serval.server.http.errors import JSON_HEADERS, error_body
from serval.server.limits import TransportGuards

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 75.0
_LINGER_S = 2.0
_TOO_EARLY_BODY = error_body("this connection was refused with 429 and sent again before its "
                             "Retry-After elapsed; refused again (wait Retry-After seconds)")
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}


@dataclass(slots=True)
class _Request:
    method: str
    path: str
    headers: RawHeaders
    body: bytes
    keep_alive: bool
    query: str = ""


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
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.pending: deque[_Request] = deque()
        self.handler: asyncio.Task[None] | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.closing = False
        self.discarding = False
        self.retry_at = 0.0  # loop time before which a request here is refused again (429)
        self.retry_after = b"1"
        self._reset_message()

    def _reset_message(self) -> None:
        self.url = b""
        self.headers: RawHeaders = []
        self.body: list[bytes] = []
        self.body_bytes = 0

    # asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.tracker.connections.add(self)
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        self._cancel_idle_timer()
        if self.discarding or self.transport is None:
            return  # refused with 413: read and drop the rest the client sends
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail_connection(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            if not self.discarding:
                self._fail_connection(400, f"malformed HTTP request: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.tracker.connections.discard(self)
        self._cancel_idle_timer()
        self.pending.clear()
        if self.handler is not None and not self.handler.done():
            self.handler.cancel()  # the client is gone: drop its queued work

    # httptools callbacks ---------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._reset_message()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        self.headers.append((name, value))
        if name == b"expect" and value.lower() == b"100-continue" and self.transport:
            self.transport.write(_CONTINUE)

    def on_headers_complete(self) -> None:
        for name, value in self.headers:
            if name == b"content-length" and value.strip().isdigit():
                self._check_body_size(int(value))

    def on_body(self, body: bytes) -> None:
        self.body_bytes += len(body)
        self._check_body_size(self.body_bytes)
        self.body.append(body)

    def _check_body_size(self, size_bytes: int) -> None:
        """413 and close before reading more than --max-request-mb (chunked bodies included)."""
        if size_bytes <= self.max_body_bytes or self.transport is None:
            return
        message = (f"request body of {size_bytes} bytes is larger than this server's limit of "
                   f"{self.max_body_bytes} bytes (--max-request-mb)")
        self._write((413, error_body(message), list(JSON_HEADERS)), keep_alive=False)
        # Lingering close: a client still sending would get a reset, not the 413, if we
        # closed with its data unread; stop writing, drop what arrives, close soon.
        self.discarding = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        asyncio.get_running_loop().call_later(_LINGER_S, self.transport.close)
        raise httptools.HttpParserError("body too large")

    def on_message_complete(self) -> None:
        url = httptools.parse_url(self.url)
        path = unquote(url.path.decode("latin-1"))
        request = _Request(
            self.parser.get_method().decode("ascii"), path, self.headers,
            b"".join(self.body), self.parser.should_keep_alive(),
            url.query.decode("latin-1") if url.query else "",
        )
        self.pending.append(request)
        if self.handler is None:
            self.handler = asyncio.get_running_loop().create_task(self._serve_pending())

    # answering -------------------------------------------------------------------------------

    async def _serve_pending(self) -> None:
        try:
            while self.pending and self.transport is not None:
                request = self.pending.popleft()
                early = self.retry_at - asyncio.get_running_loop().time() if self.retry_at else 0
                if early > 0:
                    await asyncio.sleep(early)  # a client ignoring Retry-After: no work for it
                    reply: Reply = (429, _TOO_EARLY_BODY,
                                    [*JSON_HEADERS, (b"retry-after", self.retry_after)])
                else:
                    reply = await self.app.handle(request.method, request.path, request.headers,
                                                  request.body, request.query)
                if reply[0] == 429:
                    self._note_refusal(reply[2])
                self._write(reply, request.keep_alive and not self.closing,
                            head=request.method == "HEAD")
                if not request.keep_alive or self.closing:
                    self.transport.close()
                    return
        finally:
            self.handler = None
            self._arm_idle_timer()

    def _note_refusal(self, headers: list[tuple[bytes, bytes]]) -> None:
        """A request sent here before the Retry-After just given is refused when it elapses,
        unread by the app: a client that hammers after a 429 gets one answer per Retry-After."""
        for name, value in headers:
            if name == b"retry-after":
                self.retry_after = value
                self.retry_at = asyncio.get_running_loop().time() + float(value)

    def _write(self, reply: Reply, keep_alive: bool, head: bool = False) -> None:
        """One write; a HEAD answer has the headers a GET would, and no body."""
        status, body, headers = reply
        parts = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} \r\n".encode()]
        parts += [b"%s: %s\r\n" % (name, value) for name, value in headers]
        parts.append(b"content-length: %d\r\n" % len(body))
        if not keep_alive:
            parts.append(b"connection: close\r\n")
        parts += [b"\r\n", b"" if head else body]
        assert self.transport is not None
        self.transport.write(b"".join(parts))

    def _fail_connection(self, status: int, message: str) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._write((status, error_body(message), list(JSON_HEADERS)), keep_alive=False)
            self.transport.close()

    # lifecycle -------------------------------------------------------------------------------

    def close_when_idle(self) -> None:
        """Finish the request in hand (if any), then close."""
        self.closing = True
        if self.handler is None and self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _arm_idle_timer(self) -> None:
        self._cancel_idle_timer()
        if self.transport is not None and not self.transport.is_closing():
            loop = asyncio.get_running_loop()
            self.idle_timer = loop.call_later(IDLE_TIMEOUT_S, self.close_when_idle)

    def _cancel_idle_timer(self) -> None:
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
