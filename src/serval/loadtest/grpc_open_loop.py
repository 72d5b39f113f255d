"""An open-loop gRPC load generator: ModelInfer calls leave on a fixed schedule (grpcio aio).

Call k of a process is due at start + k / rate and its latency runs from that due time, so a
stalling server is not hidden (no coordinated omission). Failures are counted by kind:
``connection`` (UNAVAILABLE), ``timeout`` (DEADLINE_EXCEEDED) and ``grpc_<code>`` otherwise.
Several processes (spawned: gRPC's core must not cross a fork) split the rate.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from serval.loadtest.stats import StepResult, summarize, window_share

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_KINDS = {"unavailable": "connection", "deadline_exceeded": "timeout"}


@dataclass
class _Window:
    start_ns: int
    measure_from_ns: int
    stop_at_ns: int
    latencies: array[int] = field(default_factory=lambda: array("q"))
    served: float = 0.0
    answered: int = 0
    errors: Counter[str] = field(default_factory=Counter)

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
    if processes == 1:
        parts = [_run_process(*args[0])]
    else:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            parts = pool.starmap(_run_process, args)
    result = summarize(parts, 0, duration_s)
    result.offered_rps = rate_rps
    return result


def _run_process(target: str, requests: list[bytes], rate_rps: float, phase: float,
                 start_at: float, warmup_s: float, duration_s: float,
                 timeout_s: float) -> dict[str, Any]:
    return asyncio.run(_drive(target, requests, rate_rps, phase, start_at, warmup_s,
                              duration_s, timeout_s))


async def _drive(target: str, requests: list[bytes], rate_rps: float, phase: float,
                 start_at: float, warmup_s: float, duration_s: float,
                 timeout_s: float) -> dict[str, Any]:
    import grpc

    async with grpc.aio.insecure_channel(target) as channel:
        method = channel.unary_unary(MODEL_INFER)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        now = time.perf_counter_ns()
        window = _Window(now, now + int(warmup_s * 1e9),
                         now + int((warmup_s + duration_s) * 1e9))
        calls: set[asyncio.Task[None]] = set()
        k = 0
        while True:
            due = window.start_ns + int((k + phase) * 1e9 / rate_rps)
            if due >= window.stop_at_ns:
                break
            delay_ns = due - time.perf_counter_ns()
            if delay_ns > 0:
                await asyncio.sleep(delay_ns / 1e9)
            task = asyncio.create_task(
                _call(method, requests[k % len(requests)], due, window, timeout_s))
            calls.add(task)
            task.add_done_callback(calls.discard)
            k += 1
        if calls:
            await asyncio.wait(calls, timeout=timeout_s + 1.0)
        return window.part()


async def _call(method: Any, request: bytes, due_ns: int, window: _Window,
                timeout_s: float) -> None:
    import grpc

    remaining_s = timeout_s - (time.perf_counter_ns() - due_ns) / 1e9
    try:
        await method(request, timeout=max(0.001, remaining_s))
    except grpc.aio.AioRpcError as exc:
        code = exc.code().name.lower()
        window.errors[_KINDS.get(code, f"grpc_{code}")] += 1
        return
    done = time.perf_counter_ns()
    window.answered += 1
    if due_ns >= window.measure_from_ns:
        window.latencies.append(done - due_ns)
    window.served += window_share(due_ns, done, window.measure_from_ns, window.stop_at_ns)
