"""The in-process ONNX Runtime ceiling: best items/s over batch sizes, and batch-1 latency.

The model runs directly in this process, with as many intra-op threads as cores and spinning
off (as a server that shares its cores with HTTP work would run it), on random valid inputs.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from bench.workloads import model_spec, random_feeds

BATCH_SIZES = (1, 8, 32, 64, 128)


@dataclass
class Ceiling:
    best_items_per_s: float
    best_batch: int
    batch1_ms: float  # median latency of one batch-1 run
    by_batch: dict[int, float]  # batch size -> items/s


def engine_session(onnx_file: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])


def measure_ceiling(onnx_file: Path, max_batch: int, seconds_per_batch: float = 3.0) -> Ceiling:
    """Run the model at each batch size up to max_batch for ~seconds_per_batch each."""
    session, spec = engine_session(onnx_file), model_spec(onnx_file)
    by_batch: dict[int, float] = {}
    batch1_ms = 0.0
    for batch in [b for b in BATCH_SIZES if b <= max(1, max_batch)]:
        feed = random_feeds(spec, batch, 1)[0]
        durations = time_runs(session, feed, seconds_per_batch)
        median_s = float(np.median(durations))
        by_batch[batch] = batch / median_s  # median: robust to a noisy, shared machine
        if batch == 1:
            batch1_ms = median_s * 1e3
    best = max(by_batch, key=lambda b: by_batch[b])
    return Ceiling(by_batch[best], best, batch1_ms, by_batch)


def engine_outputs(session: ort.InferenceSession, feed: dict[str, np.ndarray]
                   ) -> dict[str, np.ndarray]:
    """What the model computes for `feed`: the reference every server's answer must match."""
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def time_runs(session: ort.InferenceSession, feed: dict[str, np.ndarray],
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
