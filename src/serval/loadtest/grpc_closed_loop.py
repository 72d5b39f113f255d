"""A closed-loop gRPC load generator: pre-serialized ModelInferRequests, bytes in and out.

`unary` clients call ModelInfer; `stream` clients each hold one ModelStreamInfer stream and
write the next request when the previous answer arrives (as tritonclient's start_stream users
do). Clients share a few HTTP/2 channels per process. Results merge like the HTTP generator's
(same StepResult, same time-share throughput).
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
MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
REQUEST_TIMEOUT_S = 30.0


@dataclass
class _Window:
    measure_from_ns: int
    stop_at_ns: int
    latencies: array[int] = field(default_factory=lambda: array("q"))
    served: float = 0.0
    errors: Counter[str] = field(default_factory=Counter)
    sample: bytes = b""

    def part(self) -> dict[str, Any]:
        return {"latencies": self.latencies.tobytes(), "served": self.served,
                "errors": dict(self.errors), "sample": self.sample,
                "sample_status": 200 if self.sample else 0}


def run_grpc_closed_loop(target: str, requests: list[bytes], concurrency: int,
                         duration_s: float, warmup_s: float = 1.0, processes: int = 1,
                         channels_per_process: int = 4, mode: str = "unary") -> StepResult:
    """Drive `concurrency` gRPC clients against target (host:port); measure after warmup_s."""
    if mode not in ("unary", "stream"):
        raise ValueError(f"mode must be 'unary' or 'stream', not {mode!r}")
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    start_at = time.time() + 1.0 + 0.3 * processes  # processes start their clocks together
    args = [(target, requests, share, offset, channels_per_process, start_at, warmup_s,
             duration_s, mode) for share, offset in zip(shares, _offsets(shares), strict=True)]
    # spawn, not fork: gRPC's core must not be inherited across fork
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        parts = pool.starmap(_run_process, args)
    return summarize(parts, concurrency, duration_s)


def _offsets(shares: list[int]) -> list[int]:
    return [sum(shares[:i]) for i in range(len(shares))]


def _run_process(target: str, requests: list[bytes], clients: int, offset: int, channels: int,
                 start_at: float, warmup_s: float, duration_s: float,
                 mode: str) -> dict[str, Any]:
    return asyncio.run(_drive(target, requests, clients, offset, channels, start_at, warmup_s,
                              duration_s, mode))


async def _drive(target: str, requests: list[bytes], clients: int, offset: int, channels: int,
                 start_at: float, warmup_s: float, duration_s: float,
                 mode: str) -> dict[str, Any]:
    import grpc

    opened = [grpc.aio.insecure_channel(target) for _ in range(max(1, min(channels, clients)))]
    try:
        for channel in opened:
            await asyncio.wait_for(channel.channel_ready(), timeout=30)
        if mode == "unary":
            methods = [channel.unary_unary(MODEL_INFER) for channel in opened]
            client = _unary_client
        else:
            methods = [channel.stream_stream(MODEL_STREAM_INFER) for channel in opened]
            client = _stream_client
        await asyncio.sleep(max(0.0, start_at - time.time()))
        now = time.perf_counter_ns()
        window = _Window(now + int(warmup_s * 1e9), now + int((warmup_s + duration_s) * 1e9))
        await asyncio.gather(*(
            client(methods[i % len(methods)], requests, offset + i, window)
            for i in range(clients)))
        return window.part()
    finally:
        for channel in opened:
            await channel.close()


async def _unary_client(method: Any, requests: list[bytes], index: int,
                        window: _Window) -> None:
    import grpc

    while time.perf_counter_ns() < window.stop_at_ns:
        request = requests[index % len(requests)]
        index += 1
        sent = time.perf_counter_ns()
        try:
            answer = await method(request, timeout=REQUEST_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            if sent >= window.measure_from_ns:
                window.errors[f"grpc_{exc.code().name.lower()}"] += 1
            continue
        _record(window, sent, time.perf_counter_ns(), answer)


async def _stream_client(method: Any, requests: list[bytes], index: int,
                         window: _Window) -> None:
    import grpc

    call = method()
    try:
        while time.perf_counter_ns() < window.stop_at_ns:
            sent = time.perf_counter_ns()
            await call.write(requests[index % len(requests)])
            index += 1
            answer = await asyncio.wait_for(call.read(), REQUEST_TIMEOUT_S)
            _record(window, sent, time.perf_counter_ns(), answer)
        await call.done_writing()
    except (grpc.aio.AioRpcError, TimeoutError) as exc:
        kind = exc.code().name.lower() if isinstance(exc, grpc.aio.AioRpcError) else "timeout"
        window.errors[f"grpc_stream_{kind}"] += 1
    finally:
        call.cancel()


def _record(window: _Window, sent: int, done: int, answer: bytes) -> None:
    window.sample = window.sample or answer
    if sent >= window.measure_from_ns:
        window.latencies.append(done - sent)
    window.served += window_share(sent, done, window.measure_from_ns, window.stop_at_ns)
