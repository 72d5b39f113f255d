"""A closed-loop HTTP/1.1 load generator: keep-alive clients spread over processes.

Each simulated client owns one keep-alive connection and writes its next pre-encoded request the
moment the previous answer is complete (closed loop: the offered load is the concurrency).
Everything on the hot path is cheap: uvloop, a raw asyncio.Protocol per connection, responses
parsed by httptools in C, one clock read per request, no per-request timers (a watchdog scans for
overdue requests instead). The clients are split over `processes` OS processes, each with its own
event loop; they connect first, then start together. Latencies are kept only for requests sent
after the warm-up, shipped to the parent as int64 nanoseconds and merged there (see stats.py).
Throughput counts each successful request by the share of its life inside the measured window,
so it does not jump by a whole batch when a batching server answers 64 clients at once.

A 429 is sent again at once (a retry storm) unless `honour_retry_after`: then that client waits
the answer's Retry-After (seconds; 1 if absent) before its next request, as a polite client does.

Broken connections are reopened and counted; every run ends within
warmup + duration + per-request timeout (+ connect time and a few seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import httptools

from serval.loadtest.processes import run_loop, run_shares
from serval.loadtest.stats import StepResult, summarize, window_share

__all__ = ["StepResult", "encode_http_request", "run_closed_loop"]

DEFAULT_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0
RECONNECT_PAUSE_S = 0.05
_perf_ns = time.perf_counter_ns


def encode_http_request(method: str, path: str, body: bytes = b"",
                        headers: dict[str, str] | None = None, host: str = "127.0.0.1") -> bytes:
    """A complete keep-alive HTTP/1.1 request (request line, headers, body), ready to write."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: keep-alive",
             f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


@dataclass(frozen=True)
class _Plan:
    """What every process runs (picklable, so 'spawn' works too)."""

    host: str
    port: int
    requests: tuple[bytes, ...]
    warmup_s: float
    duration_s: float
    timeout_s: float
    honour_retry_after: bool = False

    def run_bound_s(self) -> float:
        """The longest one process may take once its clients are connected."""
        return self.warmup_s + self.duration_s + self.timeout_s + 2.0


def run_closed_loop(host: str, port: int, requests: list[bytes], concurrency: int,
                    duration_s: float, warmup_s: float = 1.0, processes: int = 1,
                    timeout_s: float = DEFAULT_TIMEOUT_S,
                    honour_retry_after: bool = False) -> StepResult:
    """Drive `concurrency` clients for warmup_s + duration_s; report the measured part.

    Must be called from synchronous code (it runs its own event loops). With processes == 1 the
    clients run in this process; otherwise in forked (or spawned) children.
    """
    if not requests:
        raise ValueError("at least one pre-encoded request is needed")
    if concurrency < 1 or duration_s <= 0:
        raise ValueError("concurrency must be >= 1 and duration_s > 0")
    plan = _Plan(host, port, tuple(requests), max(0.0, warmup_s), duration_s, timeout_s,
                 honour_retry_after)
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    offsets = [sum(shares[:i]) for i in range(processes)]
    parts = run_shares(_run_share, [(plan, share, offset) for share, offset
                                    in zip(shares, offsets, strict=True)],
                       30.0 + CONNECT_TIMEOUT_S + plan.run_bound_s(), synchronized=True)
    return summarize(parts, concurrency, duration_s)


def _run_share(plan: _Plan, clients: int, offset: int, barrier: Any) -> dict[str, Any]:
    return run_loop(_drive(plan, clients, offset, barrier))


@dataclass
class _State:
    """One process's measured window and what its clients saw (shared by its connections)."""

    plan: _Plan
    measure_from_ns: int = 0
    stop_at_ns: int = 0
    latencies: array[int] = field(default_factory=lambda: array("q"))
    served: float = 0.0  # 2xx answers in the window, those crossing its edges in part
    answered: int = 0  # every 2xx answer, warm-up included
    errors: Counter[str] = field(default_factory=Counter)
    sample: bytes = b""
    sample_status: int = 0
    open: set[_Connection] = field(default_factory=set)

    def start(self) -> None:
        now = _perf_ns()
        self.measure_from_ns = now + int(self.plan.warmup_s * 1e9)
        self.stop_at_ns = self.measure_from_ns + int(self.plan.duration_s * 1e9)

    def stopping(self) -> bool:
        return _perf_ns() >= self.stop_at_ns

    def part(self) -> dict[str, Any]:
        return {"latencies": self.latencies.tobytes(), "served": self.served,
                "answered": self.answered, "errors": dict(self.errors),
                "sample": self.sample, "sample_status": self.sample_status}


async def _drive(plan: _Plan, clients: int, offset: int, barrier: Any) -> dict[str, Any]:
    state = _State(plan)
    first = await asyncio.gather(*(_connect(state, offset + i, i == 0) for i in range(clients)))
    if barrier is not None:
        _wait_for_siblings(barrier)
    state.start()
    watchdog = asyncio.create_task(_watchdog(state))
    tasks = [asyncio.create_task(_client(state, offset + i, i == 0, conn))
             for i, conn in enumerate(first)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=plan.run_bound_s())
    except TimeoutError:
        state.errors["timeout"] += sum(1 for conn in state.open if conn.sent_ns)
    finally:
        watchdog.cancel()
        for conn in list(state.open):
            conn.close()
    return state.part()


def _wait_for_siblings(barrier: Any) -> None:
    """Start every process's clock together (proceed alone if a sibling never comes)."""
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(timeout=30.0 + CONNECT_TIMEOUT_S)


async def _client(state: _State, index: int, sampling: bool, conn: _Connection | None) -> None:
    """One simulated user: send on its connection until told to stop; reopen broken ones."""
    next_index = index
    while True:
        if conn is not None:
            conn.send_next()
            await conn.closed
            next_index = conn.next_index
        if state.stopping():
            return
        conn = await _connect(state, next_index, sampling)
        if conn is None:
            await asyncio.sleep(RECONNECT_PAUSE_S)


async def _connect(state: _State, next_index: int, sampling: bool) -> _Connection | None:
    loop = asyncio.get_running_loop()
    protocol = _SamplingConnection if sampling else _Connection
    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: protocol(state, next_index),
                                   state.plan.host, state.plan.port),
            timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError):
        state.errors["connection"] += 1
        return None
    return conn


async def _watchdog(state: _State) -> None:
    """Fail requests unanswered after the per-request timeout (closing their connection)."""
    timeout_ns = int(state.plan.timeout_s * 1e9)
    interval = min(1.0, state.plan.timeout_s / 4)
    while True:
        await asyncio.sleep(interval)
        now = _perf_ns()
        for conn in list(state.open):
            if conn.sent_ns and now - conn.sent_ns > timeout_ns:
                state.errors["timeout"] += 1
                conn.close()


class _Connection(asyncio.Protocol):
    """One keep-alive connection sending requests back to back; `closed` resolves at its end."""

    def __init__(self, state: _State, next_index: int) -> None:
        self.state = state
        self.requests = state.plan.requests
        self.next_index = next_index
        self.retry_after = b""
        if state.plan.honour_retry_after:
            self.on_header = self._on_header  # httptools calls it only if present
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.sent_ns = 0  # 0: no request in flight
        self.closing = False  # closed by us: not an error
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.state.open.add(self)

    def send_next(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        now = _perf_ns()
        if now >= self.state.stop_at_ns:
            self.close()
            return
        requests = self.requests
        request = requests[self.next_index % len(requests)]
        self.next_index += 1
        self.sent_ns = now
        transport.write(request)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.state.errors["bad_response"] += 1
            self.close()

    def on_message_complete(self) -> None:
        now = _perf_ns()
        sent, self.sent_ns = self.sent_ns, 0
        status = self.parser.get_status_code()
        state = self.state
        if 200 <= status < 300:
            state.answered += 1
            if sent >= state.measure_from_ns:
                state.latencies.append(now - sent)
            if sent >= state.measure_from_ns and now <= state.stop_at_ns:
                state.served += 1.0
            else:
                state.served += window_share(sent, now, state.measure_from_ns, state.stop_at_ns)
        else:
            state.errors[f"http_{status}"] += 1
            if status == 429 and state.plan.honour_retry_after:
                self._send_after_retry_after()
                return
        if self.parser.should_keep_alive():
            self.send_next()
        else:
            self.close()

    def _on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            self.retry_after = value

    def _send_after_retry_after(self) -> None:
        try:
            delay_s = max(0.0, float(self.retry_after or b"1"))
        except ValueError:
            delay_s = 1.0
        self.retry_after = b""
        if not self.parser.should_keep_alive():
            self.close()  # the next connection starts at once: only keep-alive ones wait
            return
        asyncio.get_running_loop().call_later(delay_s, self.send_next)

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.open.discard(self)
        if not self.closing:
            self.state.errors["connection"] += 1
        if not self.closed.done():
            self.closed.set_result(None)


class _SamplingConnection(_Connection):
    """A connection that also keeps its process's first answer body for the caller to check."""

    def __init__(self, state: _State, next_index: int) -> None:
        super().__init__(state, next_index)
        self.body: list[bytes] = []

    def on_body(self, body: bytes) -> None:
        if not self.state.sample_status:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if not self.state.sample_status:
            self.state.sample = b"".join(self.body)
            self.state.sample_status = self.parser.get_status_code()
        super().on_message_complete()
