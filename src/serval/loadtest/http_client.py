"""The HTTP/1.1 client connection both HTTP load generators drive, and the tally it records into.

A raw asyncio.Protocol on a keep-alive connection carries one pre-encoded request at a time;
httptools parses the answer in C. Each answer is tallied against the measured window (latency
from the request's origin: when it was sent in a closed loop, when it was due in an open one),
then handed to the connection's owner, which decides what the connection does next.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import httptools

from serval.loadtest.stats import window_share

DEFAULT_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0
_perf_ns = time.perf_counter_ns


def encode_http_request(method: str, path: str, body: bytes = b"",
                        headers: dict[str, str] | None = None, host: str = "127.0.0.1") -> bytes:
    """A complete keep-alive HTTP/1.1 request (request line, headers, body), ready to write."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: keep-alive",
             f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass
class Tally:
    """What one process's connections saw, the measured window first (shared by them all)."""

    requests: tuple[bytes, ...]
    measure_from_ns: int = 0
    stop_at_ns: int = 0
    latencies: array[int] = field(default_factory=lambda: array("q"))
    served: float = 0.0  # 2xx answers in the window, those crossing its edges in part
    answered: int = 0  # every 2xx answer, warm-up included
    errors: Counter[str] = field(default_factory=Counter)
    sample: bytes = b""  # the first answer's body, when a connection samples it
    sample_status: int = 0

    def start(self, start_ns: int, warmup_s: float, duration_s: float) -> None:
        """Open the measured window after the warm-up."""
        self.measure_from_ns = start_ns + int(warmup_s * 1e9)
        self.stop_at_ns = self.measure_from_ns + int(duration_s * 1e9)

    def record(self, status: int, origin_ns: int, done_ns: int) -> None:
        """Count one answer: a 2xx by latency and its share of the window, else by status."""
        if not 200 <= status < 300:
            self.errors[f"http_{status}"] += 1
            return
        self.answered += 1
        if origin_ns >= self.measure_from_ns:
            self.latencies.append(done_ns - origin_ns)
            if done_ns <= self.stop_at_ns:
                self.served += 1.0
                return
        self.served += window_share(origin_ns, done_ns, self.measure_from_ns, self.stop_at_ns)

    def part(self) -> dict[str, Any]:
        """This process's results, as stats.summarize merges them."""
        return {"latencies": self.latencies.tobytes(), "served": self.served,
                "answered": self.answered, "errors": dict(self.errors),
                "sample": self.sample, "sample_status": self.sample_status}


class Owner(Protocol):
    """What a load generator does when one of its connections opens, answers or ends."""

    def opened(self, conn: HttpClientConnection) -> None: ...

    def answered(self, conn: HttpClientConnection, status: int) -> None: ...

    def lost(self, conn: HttpClientConnection) -> None: ...


class HttpClientConnection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time; `closed` resolves at its end."""

    def __init__(self, tally: Tally, owner: Owner, cursor: int = 0, sample: bool = False,
                 retry_after: bool = False) -> None:
        self.tally, self.owner = tally, owner
        self.cursor = cursor  # the owner's next request index for this connection
        self.retry_after = b""  # the last answer's Retry-After, when asked to keep it
        if retry_after:
            self.on_header = self._on_header  # httptools calls it only if present
        self._body: list[bytes] | None = None
        if sample:
            self._body = []
            self.on_body = self._on_body
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.origin_ns = 0  # when the request in flight was sent (or due); 0: none in flight
        self.closing = False  # closed by us: not an error
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.owner.opened(self)

    def send(self, index: int, origin_ns: int) -> None:
        """Write request `index` (modulo the list); its latency counts from origin_ns."""
        requests = self.tally.requests
        self.origin_ns = origin_ns
        assert self.transport is not None
        self.transport.write(requests[index % len(requests)])

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.tally.errors["bad_response"] += 1
            self.close()

    def on_message_complete(self) -> None:
        now = _perf_ns()
        origin, self.origin_ns = self.origin_ns, 0
        status = self.parser.get_status_code()
        tally = self.tally
        if self._body is not None and not tally.sample_status:
            tally.sample, tally.sample_status = b"".join(self._body), status
        tally.record(status, origin, now)
        self.owner.answered(self, status)

    def _on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            self.retry_after = value

    def _on_body(self, body: bytes) -> None:
        if self._body is not None and not self.tally.sample_status:
            self._body.append(body)

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.lost(self)
        if not self.closed.done():
            self.closed.set_result(None)
