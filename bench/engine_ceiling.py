"""The in-process ONNX Runtime ceiling: best items/s over batch sizes, and batch-1 latency."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.workloads import random_feed


@dataclass
class Ceiling:
    best_items_per_s: float
    best_batch: int
    batch1_ms: float
    by_batch: dict[int, float]


def measure_ceiling(model_file: Path, max_batch: int, seconds_per_batch: float = 2.0) -> Ceiling:
    """Run the model directly at several batch sizes, engine threads = cores, no spinning."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    by_batch: dict[int, float] = {}
    batch1_ms = 0.0
    for batch in [b for b in (1, 8, 32, 64, 128) if b <= max_batch]:
        feed = random_feed(session, batch, rng)
        durations = _time_runs(session, feed, seconds_per_batch)
        by_batch[batch] = batch / float(np.median(durations))
        if batch == 1:
            batch1_ms = float(np.median(durations)) * 1e3
    best = max(by_batch, key=lambda b: by_batch[b])
    return Ceiling(by_batch[best], best, batch1_ms, by_batch)


def _time_runs(session: ort.InferenceSession, feed: dict[str, np.ndarray],
               seconds: float) -> list[float]:
    for _ in range(3):
        session.run(None, feed)
    durations: list[float] = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        started = time.perf_counter()
        session.run(None, feed)
        durations.append(time.perf_counter() - started)
    return durations
