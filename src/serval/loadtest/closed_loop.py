"""A closed-loop HTTP/1.1 load generator: keep-alive clients spread over processes.

Each simulated client owns one connection and sends its next pre-encoded request the moment
the previous answer is complete. Responses are parsed with httptools; latencies are recorded
after the warm-up only, then merged across processes.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import httptools
import numpy as np

REQUEST_TIMEOUT_S = 30.0


@dataclass
class StepResult:
    """One load level: what was offered, what came back, and how fast."""

    concurrency: int
    requests: int
    errors: dict[str, int]
    duration_s: float
    throughput_rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    mean_ms: float
    sample_body: bytes = field(default=b"", repr=False)

    @property
    def failed(self) -> int:
        return sum(self.errors.values())


def encode_http_request(method: str, path: str, body: bytes, headers: dict[str, str],
                        host: str) -> bytes:
    """A complete keep-alive HTTP/1.1 request, ready to write as is."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def run_closed_loop(host: str, port: int, requests: list[bytes], concurrency: int,
                    duration_s: float, warmup_s: float = 1.0, processes: int = 1) -> StepResult:
    """Drive `concurrency` clients for warmup_s + duration_s; report the measured part."""
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (i < concurrency % processes) for i in range(processes)]
    start_at = time.time() + 0.3 + 0.2 * processes  # every process starts the clock together
    args = [(host, port, requests, share, start_at, warmup_s, duration_s) for share in shares]
    if processes == 1:
        parts = [_run_process(*args[0])]
    else:
        with multiprocessing.get_context("fork").Pool(processes) as pool:
            parts = pool.starmap(_run_process, args)
    return _merge(parts, concurrency, duration_s)


def _run_process(host: str, port: int, requests: list[bytes], clients: int, start_at: float,
                 warmup_s: float, duration_s: float) -> dict[str, Any]:
    import uvloop

    return uvloop.run(_drive(host, port, requests, clients, start_at, warmup_s, duration_s))


async def _drive(host: str, port: int, requests: list[bytes], clients: int, start_at: float,
                 warmup_s: float, duration_s: float) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, start_at - time.time()))
    now = time.perf_counter_ns()
    window = _Window(now + int(warmup_s * 1e9), now + int((warmup_s + duration_s) * 1e9))
    tasks = [asyncio.create_task(_client(host, port, requests, i, window)) for i in range(clients)]
    await asyncio.gather(*tasks)
    return {"latencies_ns": window.latencies_ns, "errors": dict(window.errors),
            "sample": window.sample}


@dataclass
class _Window:
    """The measured interval and what was seen inside it (shared by one process's clients)."""

    measure_from_ns: int
    stop_at_ns: int
    latencies_ns: list[int] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    sample: bytes = b""

    def record(self, sent_ns: int, done_ns: int, status: int, body: bytes) -> None:
        if not self.sample:
            self.sample = body
        if sent_ns < self.measure_from_ns:
            return
        if 200 <= status < 300:
            self.latencies_ns.append(done_ns - sent_ns)
        else:
            self.errors[f"http_{status}"] += 1

    def error(self, kind: str) -> None:
        if time.perf_counter_ns() >= self.measure_from_ns:
            self.errors[kind] += 1


async def _client(host: str, port: int, requests: list[bytes], index: int,
                  window: _Window) -> None:
    loop = asyncio.get_running_loop()
    while time.perf_counter_ns() < window.stop_at_ns:
        done = loop.create_future()
        try:
            transport, _ = await loop.create_connection(
                functools.partial(_Connection, requests, index, window, done), host, port)
        except OSError:
            window.error("connection")
            await asyncio.sleep(0.05)
            continue
        try:
            await asyncio.wait_for(done, timeout=window_remaining_s(window) + REQUEST_TIMEOUT_S)
        except TimeoutError:
            window.error("timeout")
        finally:
            transport.close()


def window_remaining_s(window: _Window) -> float:
    return max(0.0, (window.stop_at_ns - time.perf_counter_ns()) / 1e9)


class _Connection(asyncio.Protocol):
    """One keep-alive connection sending requests back to back; done resolves when it ends."""

    def __init__(self, requests: list[bytes], index: int, window: _Window,
                 done: asyncio.Future[None]) -> None:
        self.requests, self.next_index, self.window, self.done = requests, index, window, done
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.sent_ns = 0
        self.body: list[bytes] = []
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        if time.perf_counter_ns() >= self.window.stop_at_ns:
            self._finish()
            return
        request = self.requests[self.next_index % len(self.requests)]
        self.next_index += 1
        self.body = []
        self.sent_ns = time.perf_counter_ns()
        self.timer = asyncio.get_running_loop().call_later(REQUEST_TIMEOUT_S, self._timed_out)
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.window.error("bad_response")
            self._finish()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        status = self.parser.get_status_code()
        self.window.record(self.sent_ns, time.perf_counter_ns(), status, b"".join(self.body))
        if self.parser.should_keep_alive():
            self._send()
        else:
            self._finish()

    def _timed_out(self) -> None:
        self.window.error("timeout")
        self._finish()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            if time.perf_counter_ns() < self.window.stop_at_ns:
                self.window.error("connection")
            self.done.set_result(None)

    def _finish(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)


def _merge(parts: list[dict[str, Any]], concurrency: int, duration_s: float) -> StepResult:
    latencies = np.concatenate([np.asarray(p["latencies_ns"], dtype=np.int64) for p in parts])
    errors: Counter[str] = Counter()
    for part in parts:
        errors.update(part["errors"])
    ms = latencies / 1e6 if latencies.size else np.zeros(1)
    p50, p90, p99, p999 = np.percentile(ms, [50, 90, 99, 99.9])
    return StepResult(
        concurrency=concurrency, requests=int(latencies.size), errors=dict(errors),
        duration_s=duration_s, throughput_rps=latencies.size / duration_s,
        p50_ms=float(p50), p90_ms=float(p90), p99_ms=float(p99), p999_ms=float(p999),
        mean_ms=float(ms.mean()),
        sample_body=next((part["sample"] for part in parts if part["sample"]), b""),
    )
