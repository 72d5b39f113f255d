"""A closed-loop gRPC load generator: pre-serialized ModelInferRequests over raw HTTP/2.

`unary` clients call ModelInfer; `stream` clients each hold one ModelStreamInfer stream and
write the next request when the previous answer arrives (as tritonclient's start_stream users
do). Clients share a few HTTP/2 connections per process (as a gRPC channel multiplexes calls);
everything runs on callbacks (grpc_client.py), so the generator costs little CPU per call. Results
merge like the HTTP generator's (same StepResult, same time-share throughput).
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from serval.loadtest.grpc_client import GrpcClientConnection, grpc_message, request_headers
from serval.loadtest.processes import run_loop, run_shares
from serval.loadtest.stats import StepResult, summarize, window_share
from serval.protocol.grpc.status import GrpcStatus

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
REQUEST_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
STATUS_NAMES = tuple(status.name.lower() for status in GrpcStatus)  # by code, from 0
_perf_ns = time.perf_counter_ns


@dataclass
class _Window:
    measure_from_ns: int
    stop_at_ns: int
    latencies: array[int] = field(default_factory=lambda: array("q"))
    served: float = 0.0
    answered: int = 0  # every successful answer, warm-up included
    errors: Counter[str] = field(default_factory=Counter)
    sample: bytes = b""

    def record(self, sent_ns: int, done_ns: int) -> None:
        self.answered += 1
        if sent_ns >= self.measure_from_ns:
            self.latencies.append(done_ns - sent_ns)
        self.served += window_share(sent_ns, done_ns, self.measure_from_ns, self.stop_at_ns)

    def part(self) -> dict[str, Any]:
        return {"latencies": self.latencies.tobytes(), "served": self.served,
                "answered": self.answered, "errors": dict(self.errors), "sample": self.sample,
                "sample_status": 200 if self.sample else 0}


def run_grpc_closed_loop(target: str, requests: list[bytes], concurrency: int,
                         duration_s: float, warmup_s: float = 1.0, processes: int = 1,
                         channels_per_process: int = 4, mode: str = "unary") -> StepResult:
    """Drive `concurrency` gRPC clients against target (host:port); measure after warmup_s."""
    if mode not in ("unary", "stream"):
        raise ValueError(f"mode must be 'unary' or 'stream', not {mode!r}")
    if not requests:
        raise ValueError("at least one serialized request is needed")
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    start_at = time.time() + 1.0 + 0.3 * processes  # processes start their clocks together
    args = [(target, requests, share, offset, channels_per_process, start_at, warmup_s,
             duration_s, mode) for share, offset in zip(shares, _offsets(shares), strict=True)]
    bound_s = start_at - time.time() + warmup_s + duration_s + REQUEST_TIMEOUT_S + 30.0
    return summarize(run_shares(_run_process, args, bound_s), concurrency, duration_s)


def _offsets(shares: list[int]) -> list[int]:
    return [sum(shares[:i]) for i in range(len(shares))]


def _run_process(target: str, requests: list[bytes], clients: int, offset: int, channels: int,
                 start_at: float, warmup_s: float, duration_s: float,
                 mode: str) -> dict[str, Any]:
    return run_loop(_drive(target, requests, clients, offset, channels, start_at, warmup_s,
                           duration_s, mode))


async def _drive(target: str, requests: list[bytes], clients: int, offset: int, channels: int,
                 start_at: float, warmup_s: float, duration_s: float,
                 mode: str) -> dict[str, Any]:
    host, _, port = target.rpartition(":")
    messages = [grpc_message(request) for request in requests]
    path = MODEL_INFER if mode == "unary" else MODEL_STREAM_INFER
    headers = request_headers(path, target)
    drivers = [_ChannelDriver(messages, headers, mode) for _ in range(max(1, min(channels,
                                                                                clients)))]
    loop = asyncio.get_running_loop()
    try:
        for driver in drivers:
            await asyncio.wait_for(driver.connect(loop, host.strip("[]"), int(port)),
                                   CONNECT_TIMEOUT_S)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        now = _perf_ns()
        window = _Window(now + int(warmup_s * 1e9), now + int((warmup_s + duration_s) * 1e9))
        for index in range(clients):
            drivers[index % len(drivers)].add_client(offset + index)
        for driver in drivers:
            driver.start(window)
        await _run_until_done(drivers, window)
        return window.part()
    except (OSError, TimeoutError) as exc:
        return {"errors": {"connection": 1}, "latencies": b"", "served": 0.0,
                "detail": str(exc)}
    finally:
        for driver in drivers:
            driver.close()


async def _run_until_done(drivers: list[_ChannelDriver], window: _Window) -> None:
    """Wait for the window to close and the calls in flight to end (or time out)."""
    await asyncio.sleep(max(0.0, (window.stop_at_ns - _perf_ns()) / 1e9))
    for driver in drivers:
        driver.finish_streams()
    give_up_ns = _perf_ns() + int(REQUEST_TIMEOUT_S * 1e9)
    while any(driver.in_flight for driver in drivers):
        if _perf_ns() > give_up_ns:
            for driver in drivers:
                window.errors["timeout"] += len(driver.in_flight)
                driver.in_flight.clear()
            return
        if all(driver.connection is None or driver.connection.closed for driver in drivers):
            return
        await asyncio.sleep(0.01)


class _ChannelDriver:
    """The clients sharing one HTTP/2 connection, each sending its next call on an answer."""

    def __init__(self, messages: list[bytes], headers: bytes, mode: str) -> None:
        self.messages, self.headers, self.mode = messages, headers, mode
        self.connection: GrpcClientConnection | None = None
        self.clients: list[int] = []
        self.in_flight: dict[int, tuple[int, int]] = {}  # stream id -> (client index, sent ns)
        self.window: _Window | None = None

    async def connect(self, loop: asyncio.AbstractEventLoop, host: str, port: int) -> None:
        _, connection = await loop.create_connection(
            lambda: GrpcClientConnection(self._on_message, self._on_end), host, port)
        self.connection = connection
        await connection.ready

    def add_client(self, index: int) -> None:
        self.clients.append(index)

    def start(self, window: _Window) -> None:
        self.window = window
        assert self.connection is not None
        for index in self.clients:
            if self.mode == "unary":
                self._call(index)
            else:
                stream_id = self.connection.open_stream(self.headers)
                self._send_on_stream(stream_id, index)
        self.connection.flush()

    def finish_streams(self) -> None:
        """Half-close the streams whose last answer already came back."""
        if self.connection is None or self.mode != "stream":
            return
        for stream_id in list(self.connection.streams):
            if stream_id not in self.in_flight:
                self.connection.stream_close(stream_id)
        self.connection.flush()

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()

    def _call(self, index: int) -> None:
        assert self.connection is not None
        message = self.messages[index % len(self.messages)]
        stream_id = self.connection.unary(self.headers, message)
        self.in_flight[stream_id] = (index, _perf_ns())

    def _send_on_stream(self, stream_id: int, index: int) -> None:
        assert self.connection is not None
        self.connection.stream_send(stream_id, self.messages[index % len(self.messages)])
        self.in_flight[stream_id] = (index, _perf_ns())

    def _on_message(self, stream_id: int, message: bytes) -> None:
        window = self.window
        assert window is not None and self.connection is not None
        if self.mode == "unary":
            window.sample = window.sample or message
            return
        index, sent_ns = self.in_flight.pop(stream_id, (0, 0))
        if not sent_ns:
            return
        now = _perf_ns()
        window.sample = window.sample or message
        window.record(sent_ns, now)
        if now < window.stop_at_ns:
            self._send_on_stream(stream_id, index + 1)
        else:
            self.connection.stream_close(stream_id)

    def _on_end(self, stream_id: int, status: int, message: str) -> None:
        window = self.window
        index, sent_ns = self.in_flight.pop(stream_id, (-1, 0))
        if window is None:
            return
        if status != 0 or (self.mode == "stream" and sent_ns):
            name = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else "broken"
            prefix = "grpc_stream_" if self.mode == "stream" else "grpc_"
            window.errors[prefix + name] += 1
        now = _perf_ns()
        if self.mode == "unary":
            if status == 0 and sent_ns:
                window.record(sent_ns, now)
            if index >= 0 and now < window.stop_at_ns and self.connection is not None \
                    and not self.connection.closed:
                self._call(index + 1)
