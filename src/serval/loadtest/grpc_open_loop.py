"""An open-loop gRPC load generator: ModelInfer calls leave on a fixed schedule (raw HTTP/2).

Call k of a process is due at start + k / rate and its latency runs from that due time, so a
stalling server is not hidden (no coordinated omission). Calls share one HTTP/2 connection per
process (grpc_client.py, callbacks only). Failures are counted by kind: ``connection`` (refused
or broken connections, UNAVAILABLE), ``timeout`` (unanswered after timeout_s from the due time, or
DEADLINE_EXCEEDED) and ``grpc_<code>`` otherwise. Several forked processes split the rate.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from serval.loadtest.grpc_client import GrpcClientConnection, grpc_message, request_headers
from serval.loadtest.grpc_closed_loop import MODEL_INFER, STATUS_NAMES
from serval.loadtest.processes import run_loop, run_shares
from serval.loadtest.stats import StepResult, summarize, window_share

_KINDS = {"unavailable": "connection", "deadline_exceeded": "timeout", "broken": "connection"}
_perf_ns = time.perf_counter_ns


@dataclass
class _Window:
    start_ns: int
    measure_from_ns: int
    stop_at_ns: int
    latencies: array[int] = field(default_factory=lambda: array("q"))
    served: float = 0.0
    answered: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    due: dict[int, int] = field(default_factory=dict)  # stream id -> due time (ns)

    def on_end(self, stream_id: int, status: int, message: str) -> None:
        due_ns = self.due.pop(stream_id, 0)
        if not due_ns:
            return
        if status != 0:
            name = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else "broken"
            self.errors[_KINDS.get(name, f"grpc_{name}")] += 1
            return
        done = _perf_ns()
        self.answered += 1
        if due_ns >= self.measure_from_ns:
            self.latencies.append(done - due_ns)
        self.served += window_share(due_ns, done, self.measure_from_ns, self.stop_at_ns)

    def part(self) -> dict[str, Any]:
        return {"latencies": self.latencies.tobytes(), "served": self.served,
                "answered": self.answered, "errors": dict(self.errors)}


def run_grpc_open_loop(target: str, requests: list[bytes], rate_rps: float, duration_s: float,
                       warmup_s: float = 1.0, processes: int = 1,
                       timeout_s: float = 30.0) -> StepResult:
    """Call ModelInfer on target (host:port) at rate_rps for warmup_s + duration_s."""
    if not requests or rate_rps <= 0 or duration_s <= 0:
        raise ValueError("need requests, rate_rps > 0 and duration_s > 0")
    processes = max(1, processes)
    start_at = time.time() + 1.0 + 0.3 * processes
    args = [(target, requests, rate_rps / processes, i / processes, start_at, warmup_s,
             duration_s, timeout_s) for i in range(processes)]
    bound_s = start_at - time.time() + warmup_s + duration_s + timeout_s + 30.0
    result = summarize(run_shares(_run_process, args, bound_s), 0, duration_s)
    result.offered_rps = rate_rps
    return result


def _run_process(target: str, requests: list[bytes], rate_rps: float, phase: float,
                 start_at: float, warmup_s: float, duration_s: float,
                 timeout_s: float) -> dict[str, Any]:
    return run_loop(_drive(target, requests, rate_rps, phase, start_at, warmup_s, duration_s,
                           timeout_s))


async def _drive(target: str, requests: list[bytes], rate_rps: float, phase: float,
                 start_at: float, warmup_s: float, duration_s: float,
                 timeout_s: float) -> dict[str, Any]:
    messages = [grpc_message(request) for request in requests]
    headers = request_headers(MODEL_INFER, target)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    now = _perf_ns()
    window = _Window(now, now + int(warmup_s * 1e9), now + int((warmup_s + duration_s) * 1e9))
    connection = await _connect(target, window)
    timeout_ns, period_ns = int(timeout_s * 1e9), 1e9 / rate_rps
    k = 0
    while (due := window.start_ns + int((k + phase) * period_ns)) < window.stop_at_ns:
        delay_ns = due - _perf_ns()
        if delay_ns > 0:
            await asyncio.sleep(delay_ns / 1e9)
        if connection is None or connection.closed:
            connection = await _connect(target, window)
        now = _perf_ns()
        while due <= now and due < window.stop_at_ns:  # every call due by now leaves now
            if connection is None:
                window.errors["connection"] += 1
            else:
                window.due[connection.unary(headers, messages[k % len(messages)])] = due
            k += 1
            due = window.start_ns + int((k + phase) * period_ns)
        _expire(window, connection, timeout_ns)
        if connection is not None:
            connection.flush()
    await _wait_for_answers(window, connection, timeout_ns)
    if connection is not None:
        connection.close()
    return window.part()


async def _connect(target: str, window: _Window) -> GrpcClientConnection | None:
    host, _, port = target.rpartition(":")
    loop = asyncio.get_running_loop()
    try:
        _, connection = await asyncio.wait_for(loop.create_connection(
            lambda: GrpcClientConnection(lambda stream_id, message: None, window.on_end),
            host.strip("[]"), int(port)), 5.0)
        await asyncio.wait_for(connection.ready, 5.0)
    except (OSError, TimeoutError):
        return None
    return connection


def _expire(window: _Window, connection: GrpcClientConnection | None, timeout_ns: int) -> None:
    """Calls unanswered timeout_ns after their due time count as timeouts and are cancelled."""
    now = _perf_ns()
    late = []
    for stream_id, due in window.due.items():  # in due order: stop at the first one in time
        if now - due <= timeout_ns:
            break
        late.append(stream_id)
    for stream_id in late:
        del window.due[stream_id]
        window.errors["timeout"] += 1
        if connection is not None:
            connection.cancel(stream_id)


async def _wait_for_answers(window: _Window, connection: GrpcClientConnection | None,
                            timeout_ns: int) -> None:
    while window.due and connection is not None and not connection.closed:
        await asyncio.sleep(0.01)
        _expire(window, connection, timeout_ns)
        connection.flush()
