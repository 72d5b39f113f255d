"""Recent rates and percentiles of one ModelStats: 1 s snapshots of its counters, diffed.

Nothing here runs on the request path: a sampler copies a version's cumulative counters once a
second (only when they moved) and derives per-second points and a ~10 s window from the diffs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from serval.observability.stats import LATENCY_BUCKETS_S, ModelStats

SERIES_POINTS = 120  # per-second points kept per version (two minutes)
WINDOW_S = 10.0  # the "recent" figures cover about this long
MARK_EVERY_S = 2.0  # spacing of the baselines the recent window is measured from
_MARKS = int(WINDOW_S / MARK_EVERY_S) + 3


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One ModelStats' cumulative counters at one instant (t_s: monotonic seconds)."""

    t_s: float
    requests: int
    successes: int
    executions: int
    inferences: int
    latency: tuple[int, ...]  # request_seconds bucket counts (not cumulative)
    queue_s: float
    queue_n: int
    compute_s: float
    compute_n: int

    @classmethod
    def of(cls, stats: ModelStats, t_s: float) -> Snapshot:
        request, queue, compute = stats.request_seconds, stats.queue_seconds, stats.compute_seconds
        return cls(t_s, request.count, stats.outcomes.get("success", 0), stats.execution_count,
                   stats.inference_count, tuple(request.counts), queue.sum, queue.count,
                   compute.sum, compute.count)


@dataclass(frozen=True, slots=True)
class Rates:
    """What happened between two snapshots, per second and as latency percentiles."""

    t_s: float
    seconds: float
    requests: int
    executions: int
    requests_per_s: float
    errors_per_s: float
    inferences_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    batch_mean: float | None
    queue_ms: float | None
    compute_ms: float | None

    def as_dict(self, epoch_offset_s: float) -> dict[str, float | int | None]:
        """JSON form; t becomes unix seconds (monotonic + offset)."""
        return {
            "t": round(self.t_s + epoch_offset_s, 3), "requests_per_s": _r(self.requests_per_s),
            "errors_per_s": _r(self.errors_per_s), "inferences_per_s": _r(self.inferences_per_s),
            "p50_ms": _r(self.p50_ms), "p99_ms": _r(self.p99_ms), "batch_mean": _r(self.batch_mean),
            "queue_ms": _r(self.queue_ms), "compute_ms": _r(self.compute_ms),
            "requests": self.requests,
        }


def between(new: Snapshot, old: Snapshot) -> Rates:
    """Rates over (old.t_s, new.t_s]."""
    seconds = max(new.t_s - old.t_s, 1e-9)
    requests = new.requests - old.requests
    executions = new.executions - old.executions
    errors = requests - (new.successes - old.successes)
    latency = [a - b for a, b in zip(new.latency, old.latency, strict=True)]
    queue_n, compute_n = new.queue_n - old.queue_n, new.compute_n - old.compute_n
    return Rates(
        new.t_s, seconds, requests, executions, requests / seconds, errors / seconds,
        (new.inferences - old.inferences) / seconds,
        _ms(quantile(0.5, latency)), _ms(quantile(0.99, latency)),
        (new.inferences - old.inferences) / executions if executions else None,
        (new.queue_s - old.queue_s) * 1000 / queue_n if queue_n else None,
        (new.compute_s - old.compute_s) * 1000 / compute_n if compute_n else None,
    )


def quantile(q: float, counts: list[int], bounds: tuple[float, ...] = LATENCY_BUCKETS_S
             ) -> float | None:
    """Prometheus' histogram_quantile over per-bucket counts: linear within the bucket."""
    total = sum(counts)
    if total <= 0:
        return None
    rank, running = q * total, 0
    for index, count in enumerate(counts):
        if running + count >= rank and count > 0:
            if index >= len(bounds):  # the +Inf bucket: the highest finite bound
                return bounds[-1]
            lower = bounds[index - 1] if index else 0.0
            return lower + (bounds[index] - lower) * (rank - running) / count
        running += count
    return bounds[-1]


class VersionWindow:
    """The recent history of one model version's counters."""

    __slots__ = ("last", "marks", "points", "recent", "stats")

    def __init__(self, stats: ModelStats, t_s: float) -> None:
        self.stats = stats
        self.last = Snapshot.of(stats, t_s)
        self.marks: deque[Snapshot] | None = None  # baselines, only while active
        self.points: deque[Rates] | None = None
        self.recent: Rates | None = None  # the last ~10 s; None when idle that long

    def moved(self) -> bool:
        stats = self.stats
        return (stats.request_seconds.count != self.last.requests
                or stats.execution_count != self.last.executions)

    def sample(self, t_s: float) -> bool:
        """Take this second's point if the counters moved; True while still recently active."""
        if self.moved():
            snapshot = Snapshot.of(self.stats, t_s)
            if self.points is None:
                self.points = deque(maxlen=SERIES_POINTS)
                self.marks = deque([self.last], maxlen=_MARKS)
            self.points.append(between(snapshot, self.last))
            self.last = snapshot
        elif self.marks is None:
            return False
        elif t_s - self.last.t_s > WINDOW_S + MARK_EVERY_S:
            self.recent, self.marks = None, None  # idle: the window is all zeros now
            return False
        self._update_recent(t_s)
        return True

    def _update_recent(self, t_s: float) -> None:
        assert self.marks is not None
        now = replace(self.last, t_s=t_s)
        if t_s - self.marks[-1].t_s >= MARK_EVERY_S:
            self.marks.append(now)
        baseline = self.marks[0]
        for mark in self.marks:
            if t_s - mark.t_s < WINDOW_S:
                break
            baseline = mark
        self.recent = between(now, baseline) if baseline.t_s < t_s else None

    def series(self, since_t_s: float) -> list[Rates]:
        return [p for p in self.points or () if p.t_s >= since_t_s]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
