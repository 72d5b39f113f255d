"""An open-loop HTTP/1.1 load generator: requests leave on a fixed schedule, whatever the answers.

Request k of a process is due at start + k / rate. It goes out on an idle keep-alive connection
(a new one is opened when none is idle, up to `max_connections`; past that it waits for one), and
its latency is measured from the time it was *due*, not the time it left: a server that stalls
shows the stall in every request scheduled behind it (no coordinated omission). Connections are
the shared http_client.HttpClientConnection on uvloop, split over forked processes like the
closed-loop generator (see closed_loop.py), and the results merge through stats.summarize.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from serval.loadtest.http_client import (
    CONNECT_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    HttpClientConnection,
    Tally,
)
from serval.loadtest.processes import run_loop, run_shares
from serval.loadtest.stats import StepResult, summarize

_perf_ns = time.perf_counter_ns


@dataclass(frozen=True)
class _Schedule:
    """What one process sends: its share of the rate, phase-shifted against its siblings."""

    host: str
    port: int
    requests: tuple[bytes, ...]
    rate_rps: float
    phase: float  # in [0, 1): this process's offset, in periods
    warmup_s: float
    duration_s: float
    timeout_s: float
    max_connections: int


def run_open_loop(host: str, port: int, requests: list[bytes], rate_rps: float,
                  duration_s: float, warmup_s: float = 1.0, processes: int = 1,
                  timeout_s: float = DEFAULT_TIMEOUT_S,
                  max_connections: int = 1024) -> StepResult:
    """Send `rate_rps` requests per second for warmup_s + duration_s; report the measured part."""
    if not requests:
        raise ValueError("at least one pre-encoded request is needed")
    if rate_rps <= 0 or duration_s <= 0:
        raise ValueError("rate_rps and duration_s must be > 0")
    processes = max(1, processes)
    schedules = [_Schedule(host, port, tuple(requests), rate_rps / processes, i / processes,
                           max(0.0, warmup_s), duration_s, timeout_s,
                           max(1, max_connections // processes)) for i in range(processes)]
    plan = schedules[0]
    parts = run_shares(_run, [(schedule,) for schedule in schedules],
                       35.0 + plan.warmup_s + plan.duration_s + plan.timeout_s, synchronized=True)
    result = summarize(parts, 0, duration_s)
    result.offered_rps = rate_rps
    return result


def _run(schedule: _Schedule, barrier: Any) -> dict[str, Any]:
    return run_loop(_drive(schedule, barrier))


@dataclass
class _State:
    """One process's clock, connection pool and backlog (the owner of every connection)."""

    plan: _Schedule
    tally: Tally
    start_ns: int = 0
    idle: list[HttpClientConnection] = field(default_factory=list)
    busy: set[HttpClientConnection] = field(default_factory=set)
    connecting: int = 0
    backlog: deque[tuple[int, int]] = field(default_factory=deque)  # (request index, due ns)

    def due_ns(self, k: int) -> int:
        return self.start_ns + int((k + self.plan.phase) * 1e9 / self.plan.rate_rps)

    def send(self, conn: HttpClientConnection, k: int, due_ns: int) -> None:
        self.busy.add(conn)
        conn.send(k, due_ns)

    def opened(self, conn: HttpClientConnection) -> None:
        pass

    def answered(self, conn: HttpClientConnection, status: int) -> None:
        self.busy.discard(conn)
        if not conn.parser.should_keep_alive():
            conn.close()
        elif self.backlog:
            self.send(conn, *self.backlog.popleft())
        else:
            self.idle.append(conn)

    def lost(self, conn: HttpClientConnection) -> None:
        if conn in self.busy:
            self.busy.discard(conn)
            if not conn.closing:
                self.tally.errors["connection"] += 1
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)


async def _drive(plan: _Schedule, barrier: Any) -> dict[str, Any]:
    state = _State(plan, Tally(plan.requests))
    if barrier is not None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=30.0)
    state.start_ns = _perf_ns()
    state.tally.start(state.start_ns, plan.warmup_s, plan.duration_s)
    watchdog = asyncio.create_task(_watchdog(state))
    try:
        await _send_on_schedule(state)
        await _drain(state)
    finally:
        watchdog.cancel()
        for conn in [*state.idle, *state.busy]:
            conn.close()
    return state.tally.part()


async def _send_on_schedule(state: _State) -> None:
    k = 0
    stop_at_ns = state.tally.stop_at_ns
    while True:
        now = _perf_ns()
        while (due := state.due_ns(k)) <= now:
            if due >= stop_at_ns:
                return
            _dispatch(state, k, due)
            k += 1
        if due >= stop_at_ns:
            return
        await asyncio.sleep((due - now) / 1e9)


async def _drain(state: _State) -> None:
    """Wait for the requests still out; whatever is left after the timeout timed out."""
    deadline = _perf_ns() + int(state.plan.timeout_s * 1e9)
    while (state.busy or state.backlog or state.connecting) and _perf_ns() < deadline:
        await asyncio.sleep(0.005)
    state.tally.errors["timeout"] += len(state.busy) + len(state.backlog)
    state.backlog.clear()


def _dispatch(state: _State, k: int, due_ns: int) -> None:
    if state.idle:
        state.send(state.idle.pop(), k, due_ns)
    elif len(state.busy) + state.connecting < state.plan.max_connections:
        state.connecting += 1
        asyncio.get_running_loop().create_task(_open_and_send(state, k, due_ns))
    else:
        state.backlog.append((k, due_ns))


async def _open_and_send(state: _State, k: int, due_ns: int) -> None:
    loop = asyncio.get_running_loop()
    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: HttpClientConnection(state.tally, state),
                                   state.plan.host, state.plan.port),
            timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError):
        state.tally.errors["connection"] += 1
        return
    finally:
        state.connecting -= 1
    state.send(conn, k, due_ns)


async def _watchdog(state: _State) -> None:
    """Fail requests unanswered after the per-request timeout (closing their connection)."""
    timeout_ns = int(state.plan.timeout_s * 1e9)
    while True:
        await asyncio.sleep(min(1.0, state.plan.timeout_s / 4))
        now = _perf_ns()
        for conn in list(state.busy):
            if now - conn.origin_ns > timeout_ns:
                state.tally.errors["timeout"] += 1
                conn.close()
