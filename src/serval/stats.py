"""Per-model counters and histograms, cheap to record on the hot path, read at scrape time."""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import dataclass, field

# Seconds; fine resolution below 1 ms where tiny models live.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0,
)
BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Histogram:
    """A fixed-bucket histogram: per-bucket counts (not cumulative), sum and count."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def add(self, other: Histogram, sign: int = 1) -> None:
        """Fold another histogram with the same buckets into this one (sign -1: take it out)."""
        self.counts = [mine + sign * theirs
                       for mine, theirs in zip(self.counts, other.counts, strict=True)]
        self.sum += sign * other.sum
        self.count += sign * other.count

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, cumulative count) pairs as Prometheus exposes them, +Inf last."""
        pairs, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            pairs.append(("+Inf" if bound == float("inf") else repr(bound), running))
        return pairs


@dataclass(slots=True)
class Duration:
    """A count and total nanoseconds, as Triton's statistics report them."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class BatchStats:
    """Compute durations of executions of one batch size."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


_HISTOGRAMS = ("request_seconds", "queue_seconds", "compute_seconds", "batch_size")
_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
              "cache_hit", "cache_miss")  # summed into the totals too (Triton's metric names)


class ModelStats:
    """Everything measured about one model version since it was loaded."""

    def __init__(self, name: str, version: str, totals: ModelStats | None = None) -> None:
        self.name, self.version = name, version
        self.totals = totals  # server-wide sums this model also feeds (metrics only)
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.cache_hit = Duration()  # the response cache: lookups that answered
        self.cache_miss = Duration()  # lookups that did not, and the insert after the run
        self.outcomes: dict[str, int] = {}
        self.requests = 0  # all outcomes, refusals too: what ranks models for metric series
        # and what the status page counts (request_seconds.count leaves refusals out)
        self.batches: dict[int, BatchStats] = {}
        self.steps: dict[str, Duration] = {}  # pipelines: time in each step, by step name
        self.request_seconds = Histogram(LATENCY_BUCKETS_S)
        self.queue_seconds = Histogram(LATENCY_BUCKETS_S)
        self.compute_seconds = Histogram(LATENCY_BUCKETS_S)
        self.batch_size = Histogram(BATCH_SIZE_BUCKETS)


    def minus(self, others: list[ModelStats], name: str) -> ModelStats:
        """These metric counters less the others' (for an 'everything else' series)."""
        rest = ModelStats(name, "")
        rest.outcomes = dict(self.outcomes)
        rest.inference_count, rest.execution_count = self.inference_count, self.execution_count
        for attribute in _DURATIONS:
            mine = getattr(self, attribute)
            getattr(rest, attribute).add(mine.ns, mine.count)
        for attribute in _HISTOGRAMS:
            getattr(rest, attribute).add(getattr(self, attribute))
        for other in others:
            for outcome, count in other.outcomes.items():
                rest.outcomes[outcome] = rest.outcomes.get(outcome, 0) - count
            rest.inference_count -= other.inference_count
            rest.execution_count -= other.execution_count
            for attribute in _DURATIONS:
                theirs = getattr(other, attribute)
                getattr(rest, attribute).add(-theirs.ns, -theirs.count)
            for attribute in _HISTOGRAMS:
                getattr(rest, attribute).add(getattr(other, attribute), sign=-1)
        return rest

    def record_request(self, outcome: str, duration_ns: int) -> None:
        """A finished request: 'success' or the error code that ended it."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.requests += 1
        (self.success if outcome == "success" else self.fail).add(duration_ns)
        self.request_seconds.observe(duration_ns * 1e-9)
        if self.totals is not None:
            self.totals.outcomes[outcome] = self.totals.outcomes.get(outcome, 0) + 1
            self.totals.requests += 1
            (self.totals.success if outcome == "success" else self.totals.fail).add(duration_ns)
            self.totals.request_seconds.observe(duration_ns * 1e-9)

    def record_refusal(self, outcome: str) -> None:
        """A request refused before it was read (overload): counted as a failure, kept out of
        the latency histograms (a 0 s answer there would pull every percentile down)."""
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        self.requests += 1
        self.fail.add(0)
        if self.totals is not None:
            self.totals.outcomes[outcome] = self.totals.outcomes.get(outcome, 0) + 1
            self.totals.requests += 1
            self.totals.fail.add(0)

    def record_step(self, step: str, duration_ns: int) -> None:
        """A pipeline step finished (successfully or not) after duration_ns."""
        duration = self.steps.get(step)
        if duration is None:
            duration = self.steps[step] = Duration()
        duration.add(duration_ns)

    def record_cache(self, hit: bool, duration_ns: int) -> None:
        """A response cache lookup (a miss's duration includes storing the result)."""
        (self.cache_hit if hit else self.cache_miss).add(duration_ns)
        if self.totals is not None:
            (self.totals.cache_hit if hit else self.totals.cache_miss).add(duration_ns)

    def record_queue(self, duration_ns: int) -> None:
        self.queue.add(duration_ns)
        self.queue_seconds.observe(duration_ns * 1e-9)
        if self.totals is not None:
            self.totals.queue.add(duration_ns)
            self.totals.queue_seconds.observe(duration_ns * 1e-9)

    def record_execution(
        self, rows: int, requests: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """One engine run over `rows` batch rows merged from `requests` requests."""
        self.execution_count += 1
        self.inference_count += rows
        self.last_inference_ms = time.time_ns() // 1_000_000
        self.compute_input.add(input_ns, requests)
        self.compute_infer.add(infer_ns, requests)
        self.compute_output.add(output_ns, requests)
        batch = self.batches.get(rows)
        if batch is None:
            batch = self.batches[rows] = BatchStats()
        batch.compute_input.add(input_ns)
        batch.compute_infer.add(infer_ns)
        batch.compute_output.add(output_ns)
        self.compute_seconds.observe((input_ns + infer_ns + output_ns) * 1e-9)
        self.batch_size.observe(rows)
        if self.totals is not None:
            self.totals.execution_count += 1
            self.totals.inference_count += rows
            self.totals.compute_input.add(input_ns, requests)
            self.totals.compute_infer.add(infer_ns, requests)
            self.totals.compute_output.add(output_ns, requests)
            self.totals.compute_seconds.observe((input_ns + infer_ns + output_ns) * 1e-9)
            self.totals.batch_size.observe(rows)

    def as_triton_dict(self) -> dict[str, object]:
        """The model_stats entry of Triton's statistics extension (+ pipeline_steps)."""
        entry = self._triton_entry()
        if self.steps:
            entry["pipeline_steps"] = [{"step": name, **duration.as_dict()}
                                       for name, duration in self.steps.items()]
        return entry

    def _triton_entry(self) -> dict[str, object]:
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": self.cache_hit.as_dict(),
                "cache_miss": self.cache_miss.as_dict(),
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": batch.compute_input.as_dict(),
                    "compute_infer": batch.compute_infer.as_dict(),
                    "compute_output": batch.compute_output.as_dict(),
                }
                for size, batch in sorted(self.batches.items())
            ],
            "memory_usage": [],
        }
