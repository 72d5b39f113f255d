"""A closed-loop HTTP/1.1 load generator: keep-alive clients spread over processes.

Each simulated client owns one keep-alive connection and writes its next pre-encoded request the
moment the previous answer is complete (closed loop: the offered load is the concurrency).
Everything on the hot path is cheap: uvloop, the shared http_client.HttpClientConnection (a raw
asyncio.Protocol, responses parsed by httptools in C), one clock read per request, no
per-request timers (a watchdog scans for overdue requests instead). The clients are split over
`processes` OS processes, each with its own event loop; they connect first, then start together.
Latencies are kept only for requests sent after the warm-up, shipped to the parent as int64
nanoseconds and merged there (see stats.py).
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
from dataclasses import dataclass, field
from typing import Any, cast

from serval.loadtest.http_client import (
    CONNECT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    HttpClientConnection,
    Tally,
)
from serval.loadtest.processes import run_loop, run_shares
from serval.loadtest.stats import StepResult, summarize

__all__ = ["StepResult", "run_closed_loop"]

RECONNECT_PAUSE_S = 0.05
_perf_ns = time.perf_counter_ns


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
    stride: int = 1  # client i sends requests i, i + stride, ... (stride: all the clients)

    def run_bound_s(self) -> float:
        """The longest one process may take once its clients are connected."""
        return self.warmup_s + self.duration_s + self.timeout_s + 2.0


def run_closed_loop(host: str, port: int, requests: list[bytes], concurrency: int,
                    duration_s: float, warmup_s: float = 1.0, processes: int = 1,
                    timeout_s: float = DEFAULT_TIMEOUT_S,
                    honour_retry_after: bool = False) -> StepResult:
    """Drive `concurrency` clients for warmup_s + duration_s; report the measured part.

    Must be called from synchronous code (it runs its own event loops). With processes == 1 the
    clients run in this process; otherwise in forked (or spawned) children. Client i sends
    requests i, i + concurrency, ... of the list (round the list), so that each request goes
    out once per pass, as from that many different users.
    """
    if not requests:
        raise ValueError("at least one pre-encoded request is needed")
    if concurrency < 1 or duration_s <= 0:
        raise ValueError("concurrency must be >= 1 and duration_s > 0")
    plan = _Plan(host, port, tuple(requests), max(0.0, warmup_s), duration_s, timeout_s,
                 honour_retry_after, stride=concurrency)
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
    """One process's clients: the connections they hold open, and what each answer makes them do
    (the owner of every connection, send the next request at once or after a Retry-After)."""

    plan: _Plan
    tally: Tally
    open: set[HttpClientConnection] = field(default_factory=set)

    def stopping(self) -> bool:
        return _perf_ns() >= self.tally.stop_at_ns

    def send_next(self, conn: HttpClientConnection) -> None:
        transport = conn.transport
        if transport is None or transport.is_closing():
            return
        now = _perf_ns()
        if now >= self.tally.stop_at_ns:
            conn.close()
            return
        conn.send(conn.cursor, now)
        conn.cursor += self.plan.stride  # the clients share out the list, not walk it together

    def opened(self, conn: HttpClientConnection) -> None:
        self.open.add(conn)

    def answered(self, conn: HttpClientConnection, status: int) -> None:
        if status == 429 and self.plan.honour_retry_after:
            self._send_after_retry_after(conn)
        elif conn.parser.should_keep_alive():
            self.send_next(conn)
        else:
            conn.close()

    def _send_after_retry_after(self, conn: HttpClientConnection) -> None:
        try:
            delay_s = max(0.0, float(conn.retry_after or b"1"))
        except ValueError:
            delay_s = 1.0
        conn.retry_after = b""
        if not conn.parser.should_keep_alive():
            conn.close()  # the next connection starts at once: only keep-alive ones wait
            return
        asyncio.get_running_loop().call_later(delay_s, self.send_next, conn)

    def lost(self, conn: HttpClientConnection) -> None:
        self.open.discard(conn)
        if not conn.closing:
            self.tally.errors["connection"] += 1


async def _drive(plan: _Plan, clients: int, offset: int, barrier: Any) -> dict[str, Any]:
    state = _State(plan, Tally(plan.requests))
    first = await asyncio.gather(*(_connect(state, offset + i, i == 0) for i in range(clients)))
    if barrier is not None:
        _wait_for_siblings(barrier)
    state.tally.start(_perf_ns(), plan.warmup_s, plan.duration_s)
    watchdog = asyncio.create_task(_watchdog(state))
    tasks = [asyncio.create_task(_client(state, offset + i, i == 0, conn))
             for i, conn in enumerate(first)]
    # asyncio.wait, not wait_for(gather): cancelled by Ctrl-C, wait_for leaves the gather's
    # CancelledError unretrieved, and asyncio prints it as a traceback
    try:
        _, pending = await asyncio.wait(tasks, timeout=plan.run_bound_s())
        if pending:
            state.tally.errors["timeout"] += sum(1 for conn in state.open if conn.origin_ns)
    finally:
        watchdog.cancel()
        for task in tasks:
            task.cancel()
        for conn in list(state.open):
            conn.close()
    for task in tasks:  # a client that failed fails the step, as gather made it
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise cast(BaseException, task.exception())
    return state.tally.part()


def _wait_for_siblings(barrier: Any) -> None:
    """Start every process's clock together (proceed alone if a sibling never comes)."""
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(timeout=30.0 + CONNECT_TIMEOUT_S)


async def _client(state: _State, index: int, sampling: bool,
                  conn: HttpClientConnection | None) -> None:
    """One simulated user: send on its connection until told to stop; reopen broken ones."""
    next_index = index
    while True:
        if conn is not None:
            state.send_next(conn)
            await conn.closed
            next_index = conn.cursor
        if state.stopping():
            return
        conn = await _connect(state, next_index, sampling)
        if conn is None:
            await asyncio.sleep(RECONNECT_PAUSE_S)


async def _connect(state: _State, next_index: int, sampling: bool
                   ) -> HttpClientConnection | None:
    loop = asyncio.get_running_loop()
    retry_after = state.plan.honour_retry_after
    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(
                lambda: HttpClientConnection(state.tally, state, next_index, sampling,
                                             retry_after),
                state.plan.host, state.plan.port),
            timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError):
        state.tally.errors["connection"] += 1
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
            if conn.origin_ns and now - conn.origin_ns > timeout_ns:
                state.tally.errors["timeout"] += 1
                conn.close()
