"""What one load level measured, merged from every generator process into a StepResult."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class StepResult:
    """One load level: what was offered, what came back, and how fast.

    `requests` counts the successful (2xx) requests sent inside the measured window; the
    latencies are theirs. `throughput_rps` counts every successful request by the share of its
    time inside the window (a request half in it counts one half), so it does not jump by a
    whole batch when a batching server answers many clients at once. `errors` counts failures
    over the whole run, warm-up included: ``http_<code>`` for non-2xx answers, ``connection``
    for refused or broken connections, ``timeout`` for requests unanswered after the per-request
    timeout, ``bad_response`` for answers that are not HTTP. `sample_body` is the first answer
    body the first process received (`sample_bodies`: one per process). `answered` counts every
    2xx answer of the run, warm-up included (what the server's statistics count as successes);
    `offered_rps` is the fixed rate of an open-loop step (0 for a closed loop).
    """

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
    sample_status: int = 0
    sample_bodies: list[bytes] = field(default_factory=list, repr=False)
    answered: int = 0
    offered_rps: float = 0.0
    cdf_ms: list[list[float]] = field(default_factory=list, repr=False)  # [percentile, ms]

    @property
    def failed(self) -> int:
        """Every failed request, whatever the kind."""
        return sum(self.errors.values())


def summarize(parts: Iterable[dict[str, Any]], concurrency: int, duration_s: float) -> StepResult:
    """Merge the processes' raw parts (latencies as int64 ns bytes, errors, samples)."""
    parts = list(parts)
    latencies = np.concatenate([np.empty(0, dtype=np.int64)] + [
        np.frombuffer(p.get("latencies", b""), dtype=np.int64) for p in parts])
    errors: Counter[str] = Counter()
    for part in parts:
        errors.update(part.get("errors", {}))
    p50, p90, p99, p999, mean = _percentiles_ms(latencies)
    samples = [(p["sample"], p.get("sample_status", 0)) for p in parts if p.get("sample")]
    first_body, first_status = samples[0] if samples else (b"", 0)
    return StepResult(
        concurrency=concurrency, requests=int(latencies.size),
        errors={kind: count for kind, count in sorted(errors.items()) if count},
        duration_s=duration_s, throughput_rps=_served(parts, latencies.size) / duration_s,
        p50_ms=p50, p90_ms=p90, p99_ms=p99, p999_ms=p999, mean_ms=mean,
        sample_body=first_body, sample_status=first_status,
        sample_bodies=[body for body, _ in samples],
        answered=int(sum(p.get("answered", 0) for p in parts)),
        cdf_ms=latency_cdf_ms(latencies),
    )


def _served(parts: list[dict[str, Any]], measured: int) -> float:
    """Requests served in the window: the processes' fractional counts, else the sample count."""
    if parts and all("served" in part for part in parts):
        return float(sum(part["served"] for part in parts))
    return float(measured)


def _percentiles_ms(latencies_ns: np.ndarray) -> tuple[float, float, float, float, float]:
    """p50, p90, p99, p99.9 and mean in milliseconds (zeros when nothing was measured)."""
    if latencies_ns.size == 0:
        return 0.0, 0.0, 0.0, 0.0, 0.0
    ms = latencies_ns.astype(np.float64) / 1e6
    p50, p90, p99, p999 = np.percentile(ms, [50, 90, 99, 99.9])
    return float(p50), float(p90), float(p99), float(p999), float(ms.mean())


CDF_PERCENTILES = (0.0, 1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0,
                   97.5, 99.0, 99.5, 99.9, 99.99, 100.0)


def latency_cdf_ms(latencies_ns: np.ndarray) -> list[list[float]]:
    """[percentile, latency ms] pairs on a fixed grid: enough to draw the CDF in a report."""
    if latencies_ns.size == 0:
        return []
    values = np.percentile(latencies_ns.astype(np.float64) / 1e6, CDF_PERCENTILES)
    return [[p, float(v)] for p, v in zip(CDF_PERCENTILES, values, strict=True)]


def window_share(sent_ns: int, done_ns: int, start_ns: int, stop_ns: int) -> float:
    """The share of one request's life inside the measured window [start_ns, stop_ns)."""
    inside = min(done_ns, stop_ns) - max(sent_ns, start_ns)
    return max(0, inside) / max(1, done_ns - sent_ns)
