"""One HTTP/1.1 request's bytes into a `Request`, or a `Refusal`, within the server's limits.

Everything is counted as it arrives, before it is buffered: the request target (414), the
request line and headers in bytes and count (431: httptools only reports a header once it is
complete, so bytes fed without any callback are counted too, in slices of at most the header
limit), the body (413). When the headers are complete, before a byte of the body is read or
`100 Continue` sent: the application's authorization (401/403) and whether the announced body
fits the server-wide receive budget (429); the budget then holds the body's bytes as they arrive.
A refusal stops parsing and is queued behind the requests read before it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import unquote

import httptools

from serval.auth import Token
from serval.server.http.app import Routes
from serval.server.http.infer_headers import RawHeaders
from serval.server.http.wire import Refusal, refusal
from serval.server.limits import TransportGuards

_SLICE_BYTES = 16 * 1024  # parsed at a time: a pipelining client's requests, few at once


@dataclass(slots=True)
class Request:
    method: str
    path: str
    headers: RawHeaders
    body: bytes
    keep_alive: bool
    query: str = ""
    reserved: int = 0  # bytes of the receive budget held until the answer is written
    authorized: Token | None = None  # the caller the app's precheck found (None: not asked)
    http10: bool = False  # an HTTP/1.0 request: no chunked answer, keep-alive said aloud
    head: bool = False  # HEAD: served as GET (authorization too), answered without the body


class _Refused(Exception):
    """Raised from a parser callback after queueing a refusal: stop parsing."""


class RequestReader(asyncio.Protocol):
    """The parsing half of a connection; the connection answers what `_enqueue` is given."""

    def __init__(self, app: Routes, guards: TransportGuards) -> None:
        self.app, self.guards, self.limits = app, guards, guards.limits
        self.max_body_bytes = guards.limits.max_request_bytes
        self.max_header_bytes = guards.limits.max_header_bytes
        self.max_header_count = guards.limits.max_header_count
        self.loop = asyncio.get_running_loop()
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.refused = False  # a refusal is queued: parse nothing more
        self.reserved_total = 0  # receive budget held by this connection, all requests
        # phase: headers from connection open (first request) or first byte; then body
        self.in_headers, self.in_body, self.started = True, False, False
        self.last_read = self.header_started = self.loop.time()
        self.progress = False  # a parser callback ran during the current feed
        self.stalled = 0  # bytes fed with no callback at all (inside one header or chunk line)
        self.slice_bytes = min(self.max_header_bytes, _SLICE_BYTES)
        self.unparsed: memoryview | None = None  # read, kept back while enough requests wait
        self._reset_message()

    def _reset_message(self) -> None:
        self.url = b""
        self.headers: RawHeaders = []
        self.body: list[bytes] = []
        self.body_bytes = self.header_bytes = self.reserved = self.header_count = 0
        self.hosts = 0
        self.content_length = -1  # -1: none given
        self.chunked = self.expect_continue = self.continue_owed = self.http10 = False
        self.head = False
        self.authorized: Token | None = None
        self.method, self.path, self.query = "", "", ""

    # what the connection provides ------------------------------------------------------------

    def _enqueue(self, item: Request | Refusal) -> None:
        raise NotImplementedError

    def _answering(self) -> bool:
        """Whether a request read earlier is still waiting for its answer."""
        raise NotImplementedError

    def _last_queued(self) -> Request | Refusal | None:
        raise NotImplementedError

    def _send_continue(self) -> None:
        raise NotImplementedError

    def _read_ahead_full(self) -> bool:
        """Whether enough requests wait for answers: parse no further for now."""
        raise NotImplementedError

    # bytes in --------------------------------------------------------------------------------

    def _receive(self, data: bytes | memoryview) -> None:
        """Parse data in slices: a header never grows a slice past its limit, and what is past
        the read-ahead limit waits in `unparsed` (see `_resume_parsing`)."""
        if self.refused or self.parser is None:
            return  # refused: read and drop what the client still sends (lingering close)
        if self.unparsed is not None:  # (not expected: reading pauses while it is kept)
            data, self.unparsed = bytes(self.unparsed) + data, None
        step = self.slice_bytes
        if len(data) <= step:
            self._feed(data)
            return
        view = memoryview(data)
        for start in range(0, len(view), step):
            if start and self._read_ahead_full():
                self.unparsed = view[start:]
                return
            self._feed(view[start:start + step])
            if self.refused:
                return

    def _resume_parsing(self) -> None:
        """The connection caught up: parse what was kept back."""
        if self.unparsed is not None:
            data, self.unparsed = self.unparsed, None
            self._receive(data)

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
        # every request's path, once per header: locals, and the limits in two comparisons
        self.progress = True
        name = name.lower()
        headers = self.headers
        headers.append((name, value))
        size = self.header_bytes = self.header_bytes + len(name) + len(value) + 4
        if size > self.max_header_bytes:
            self._refuse(self._header_too_large(), "header limit")
            raise _Refused
        if len(headers) > self.max_header_count:
            self._abort(431, f"more than {self.max_header_count} header fields "
                             "(--max-header-count)")
        if name == b"content-length":
            self.content_length = int(value) if value.strip().isdigit() else -1
        elif name == b"transfer-encoding":
            self._transfer_codings(value)
            self.chunked = True
        elif name == b"host":
            self.hosts += 1
        elif name == b"expect" and value.lower() == b"100-continue":
            self.expect_continue = True

    def _transfer_codings(self, value: bytes) -> None:
        """Only `chunked` is understood: any other coding (gzip, deflate, ...) would reach the
        application still encoded, so it is refused as RFC 9112 says (501), as nginx does."""
        for coding in value.split(b","):
            coding = coding.strip().lower()
            if coding not in (b"chunked", b""):  # (a list may hold empty elements)
                shown = coding[:40].decode("latin-1")
                self._refuse(refusal(501, f"Transfer-Encoding '{shown}' is not supported; a "
                                          "request body may only be sent chunked "
                                          "(Transfer-Encoding: chunked), compressed ones "
                                          "with Content-Encoding"))
                raise _Refused

    def on_headers_complete(self) -> None:
        self.progress, self.in_headers, self.in_body = True, False, True
        self.header_count = len(self.headers)  # what follows (a chunked body's trailers) is not
        assert self.parser is not None
        try:
            url = httptools.parse_url(self.url)
        except httptools.HttpParserError:
            self._abort(400, "malformed HTTP request: invalid request target")
        self.method = self.parser.get_method().decode("latin-1")
        if self.method == "HEAD":  # RFC 9110 9.3.2: GET's answer without its body
            self.method, self.head = "GET", True
        if self.parser.get_http_version() != "1.1":
            self._old_version()
        if self.hosts != 1 and (self.hosts or not self.http10):
            self._no_single_host()
        self.path = unquote(url.path.decode("latin-1"))
        self.query = url.query.decode("latin-1") if url.query else ""
        if self.content_length > 0 or self.chunked:
            self._admit_body()

    def _old_version(self) -> None:
        """HTTP/1.0 is served (its keep-alive said aloud, answers never chunked); other versions
        get 505, and an HTTP/1.0 request with Transfer-Encoding 400, as nginx does (RFC 9112
        6.1: its framing is faulty; a 1.0 proxy before us may have framed it otherwise)."""
        assert self.parser is not None
        version = self.parser.get_http_version()
        if version != "1.0":
            self._refuse(refusal(505, f"HTTP/{version} is not supported; send HTTP/1.1 or 1.0"))
            raise _Refused
        if self.chunked:
            self._abort(400, "an HTTP/1.0 request cannot carry Transfer-Encoding; send "
                             "Content-Length (or HTTP/1.1)")
        self.http10 = True

    def _no_single_host(self) -> None:
        """RFC 9112 3.2: an HTTP/1.1 request without Host, or any request with several, is a
        400 (as nginx answers); which name a request meant must never be a guess."""
        expected = "at most one" if self.http10 else "exactly one"
        self._abort(400, f"a request must have {expected} Host header (RFC 9112 3.2); this one "
                         f"has {self.hosts}")

    def on_body(self, body: bytes) -> None:
        self.progress = True
        arrived = self.body_bytes = self.body_bytes + len(body)
        if arrived > self.reserved:  # the budget holds what has arrived
            if arrived > self.max_body_bytes:
                self._check_body_size(arrived)
            self._reserve(arrived - self.reserved)
        self.body.append(body)

    def on_chunk_header(self) -> None:
        self.progress = True

    def on_chunk_complete(self) -> None:
        self.progress = True

    def on_message_complete(self) -> None:
        assert self.parser is not None
        self.progress, self.in_body, self.started = True, False, False
        self.continue_owed = False
        if len(self.headers) > self.header_count:  # trailers: counted against the header
            del self.headers[self.header_count:]  # limits, never merged (RFC 9110 6.5.1)
        request = Request(self.method, self.path, self.headers, b"".join(self.body),
                          self.parser.should_keep_alive(), self.query, self.reserved,
                          self.authorized, self.http10, self.head)
        self.reserved = 0  # the request holds it now
        self.body = []
        self._enqueue(request)

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
        checked = self.app.precheck(self.method, self.path, self.headers)
        if not isinstance(checked, Token):
            self._refuse(Refusal(checked))
            raise _Refused
        self.authorized = checked  # the app need not check the token again
        self._check_body_size(self.content_length)
        if self.content_length > 0 and not self.guards.budget.fits(self.content_length):
            self._refuse(self._over_budget(self.content_length))
            raise _Refused
        if self.expect_continue and self.parser is not None \
                and self.parser.get_http_version() != "1.0":
            if self._answering():
                self.continue_owed = True  # a 1xx belongs to the request being answered
            else:
                self._send_continue()

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
        self._enqueue(answer)

    def _upgrade_refused(self) -> None:
        """Upgrade or CONNECT: answer the request as plain HTTP/1.1 (RFC 9110 lets a server
        ignore Upgrade), then close; nothing after it is parsed."""
        last = self._last_queued()
        if isinstance(last, Request):
            self.refused, last.keep_alive = True, False
        else:
            self._refuse(refusal(400, "protocol upgrades are not supported"))
