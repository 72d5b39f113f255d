"""Step 5: size on disk, latency at batch 1 and throughput at batch 32, in process, with the
serving session settings (all graph optimizations, the process's cores, no idle spinning)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serval.optimize.samples import Feeds, rows, take

LATENCY_BATCH = 1
THROUGHPUT_BATCH = 32


@dataclass(frozen=True, slots=True)
class Measurement:
    """One model's cost on this machine."""

    size_bytes: int
    latency_p50_ms: float
    latency_p90_ms: float
    throughput_items_per_s: float
    threads: int
    graph_optimization_level: str


def serving_session(path: Path | bytes, threads: int, level: str = "all") -> object:
    """An ONNX Runtime session set up as `serval serve` sets one up by default (from a file,
    or a serialized model)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    model = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def measure(path: Path, feeds: Feeds, *, duration_s: float = 2.0, threads: int | None = None,
            level: str = "all") -> Measurement:
    """Time the model on rows of feeds (repeated to fill a batch of 32 if there are fewer)."""
    threads = threads or os.cpu_count() or 1
    session = serving_session(path, threads, level)
    single = take(feeds, slice(0, LATENCY_BATCH))
    batch = _batch(feeds, THROUGHPUT_BATCH)
    latencies = _timed(session, single, duration_s / 2)
    batch_times = _timed(session, batch, duration_s / 2)
    return Measurement(
        size_bytes=path.stat().st_size,
        latency_p50_ms=float(np.percentile(latencies, 50) * 1e3),
        latency_p90_ms=float(np.percentile(latencies, 90) * 1e3),
        throughput_items_per_s=THROUGHPUT_BATCH / float(np.median(batch_times)),
        threads=threads, graph_optimization_level=level)


def interleaved_throughput(paths: list[Path], feeds: Feeds, *, threads: int | None = None,
                           rounds: int = 5, round_s: float = 0.4,
                           levels: list[str] | None = None) -> list[float]:
    """Batch-32 items/s of each model (each at its graph optimization level, default `all`),
    the median of `rounds` rounds that visit every model in turn: a busy or drifting machine
    then slows all of them alike, and models that differ by a few percent are still told
    apart."""
    sessions = [serving_session(path, threads or os.cpu_count() or 1, level)
                for path, level in zip(paths, levels or ["all"] * len(paths), strict=True)]
    batch = _batch(feeds, THROUGHPUT_BATCH)
    per_model: list[list[float]] = [[] for _ in paths]
    for _ in range(rounds):
        for session, rates in zip(sessions, per_model, strict=True):
            rates.append(THROUGHPUT_BATCH / float(np.median(_timed(session, batch, round_s))))
    return [float(np.median(rates)) for rates in per_model]


def _batch(feeds: Feeds, size: int) -> Feeds:
    index = np.arange(size) % rows(feeds)
    return take(feeds, index)


def _timed(session: object, feeds: Feeds, duration_s: float) -> list[float]:
    run = session.run  # type: ignore[attr-defined]
    run(None, feeds)  # warm-up: first-run allocations are not the model's cost
    times: list[float] = []
    deadline = time.perf_counter() + duration_s
    while time.perf_counter() < deadline or len(times) < 3:
        started = time.perf_counter()
        run(None, feeds)
        times.append(time.perf_counter() - started)
    return times
