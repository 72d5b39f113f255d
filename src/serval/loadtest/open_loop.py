"""An open-loop HTTP/1.1 load generator: requests leave on a fixed schedule, whatever the answers.

Request k of a process is due at start + k / rate. It goes out on an idle keep-alive connection
(a new one is opened when none is idle, up to `max_connections`; past that it waits for one), and
its latency is measured from the time it was *due*, not the time it left: a server that stalls
shows the stall in every request scheduled behind it (no coordinated omission). Connections are
raw asyncio protocols parsed by httptools on uvloop, split over forked processes like the
closed-loop generator (see closed_loop.py), and the results merge through stats.summarize.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from array import array
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, cast

import httptools

from serval.loadtest.closed_loop import CONNECT_TIMEOUT_S, DEFAULT_TIMEOUT_S
from serval.loadtest.processes import run_loop, run_shares
from serval.loadtest.stats import StepResult, summarize, window_share

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
    """One process's clock, connection pool, backlog and measurements."""

    plan: _Schedule
    start_ns: int = 0
    measure_from_ns: int = 0
    stop_at_ns: int = 0
    latencies: array[int] = field(default_factory=lambda: array("q"))
    served: float = 0.0
    answered: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    idle: list[_Connection] = field(default_factory=list)
    busy: set[_Connection] = field(default_factory=set)
    connecting: int = 0
    backlog: deque[tuple[int, int]] = field(default_factory=deque)  # (request index, due ns)

    def due_ns(self, k: int) -> int:
        return self.start_ns + int((k + self.plan.phase) * 1e9 / self.plan.rate_rps)

    def part(self) -> dict[str, Any]:
        return {"latencies": self.latencies.tobytes(), "served": self.served,
                "answered": self.answered, "errors": dict(self.errors)}


async def _drive(plan: _Schedule, barrier: Any) -> dict[str, Any]:
    state = _State(plan)
    if barrier is not None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=30.0)
    state.start_ns = _perf_ns()
    state.measure_from_ns = state.start_ns + int(plan.warmup_s * 1e9)
    state.stop_at_ns = state.measure_from_ns + int(plan.duration_s * 1e9)
    watchdog = asyncio.create_task(_watchdog(state))
    try:
        await _send_on_schedule(state)
        await _drain(state)
    finally:
        watchdog.cancel()
        for conn in [*state.idle, *state.busy]:
            conn.close()
    return state.part()


async def _send_on_schedule(state: _State) -> None:
    k = 0
    while True:
        now = _perf_ns()
        while (due := state.due_ns(k)) <= now:
            if due >= state.stop_at_ns:
                return
            _dispatch(state, k, due)
            k += 1
        if due >= state.stop_at_ns:
            return
        await asyncio.sleep((due - now) / 1e9)


async def _drain(state: _State) -> None:
    """Wait for the requests still out; whatever is left after the timeout timed out."""
    deadline = _perf_ns() + int(state.plan.timeout_s * 1e9)
    while (state.busy or state.backlog or state.connecting) and _perf_ns() < deadline:
        await asyncio.sleep(0.005)
    state.errors["timeout"] += len(state.busy) + len(state.backlog)
    state.backlog.clear()


def _dispatch(state: _State, k: int, due_ns: int) -> None:
    if state.idle:
        state.idle.pop().send(k, due_ns)
    elif len(state.busy) + state.connecting < state.plan.max_connections:
        state.connecting += 1
        asyncio.get_running_loop().create_task(_open_and_send(state, k, due_ns))
    else:
        state.backlog.append((k, due_ns))


async def _open_and_send(state: _State, k: int, due_ns: int) -> None:
    loop = asyncio.get_running_loop()
    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(lambda: _Connection(state), state.plan.host, state.plan.port),
            timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError):
        state.errors["connection"] += 1
        return
    finally:
        state.connecting -= 1
    conn.send(k, due_ns)


async def _watchdog(state: _State) -> None:
    """Fail requests unanswered after the per-request timeout (closing their connection)."""
    timeout_ns = int(state.plan.timeout_s * 1e9)
    while True:
        await asyncio.sleep(min(1.0, state.plan.timeout_s / 4))
        now = _perf_ns()
        for conn in list(state.busy):
            if now - conn.due_ns > timeout_ns:
                state.errors["timeout"] += 1
                conn.close()


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one scheduled request at a time."""

    def __init__(self, state: _State) -> None:
        self.state = state
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.due_ns = 0
        self.closing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def send(self, k: int, due_ns: int) -> None:
        requests = self.state.plan.requests
        self.due_ns = due_ns
        self.state.busy.add(self)
        assert self.transport is not None
        self.transport.write(requests[k % len(requests)])

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.state.errors["bad_response"] += 1
            self.close()

    def on_message_complete(self) -> None:
        now, state, due = _perf_ns(), self.state, self.due_ns
        status = self.parser.get_status_code()
        state.busy.discard(self)
        if 200 <= status < 300:
            state.answered += 1
            if due >= state.measure_from_ns:
                state.latencies.append(now - due)
            state.served += window_share(due, now, state.measure_from_ns, state.stop_at_ns)
        else:
            state.errors[f"http_{status}"] += 1
        if not self.parser.should_keep_alive():
            self.close()
        elif state.backlog:
            self.send(*state.backlog.popleft())
        else:
            state.idle.append(self)

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        state = self.state
        if self in state.busy:
            state.busy.discard(self)
            if not self.closing:
                state.errors["connection"] += 1
        with contextlib.suppress(ValueError):
            state.idle.remove(self)
