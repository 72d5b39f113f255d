"""Recent rates and percentiles of one ModelStats: 1 s snapshots of its counters, diffed.

Nothing here runs on the request path: a sampler copies a version's cumulative counters once a
second (only when they moved) and derives per-second points and a ~10 s window from the diffs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from serval.stats import LATENCY_BUCKETS_S, ModelStats

SERIES_POINTS = 120  # per-second points kept per version (two minutes)
POINTS_PER_SECOND = 100  # the busiest versions of each second get a chart point
WINDOW_S = 10.0  # the "recent" figures cover about this long
MARK_EVERY_S = 2.0  # spacing of the baselines the recent window is measured from
_MARKS = int(WINDOW_S / MARK_EVERY_S) + 3


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One ModelStats' cumulative counters at one instant (t_s: monotonic seconds)."""

    t_s: float
    requests: int  # every outcome, requests refused at admission too
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
        return cls(t_s, stats.requests, stats.outcomes.get("success", 0), stats.execution_count,
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
    """The recent history of one model version's counters.

    poll() runs every second for every version and only compares two integers; a version that
    moved keeps baselines (a full snapshot every MARK_EVERY_S) while active, and gets a
    per-second point only when the sampler picks it (the busiest versions of that second).
    """

    __slots__ = ("full", "marks", "moved_t_s", "point_base", "points", "seen_executions",
                 "seen_requests", "state", "stats")

    def __init__(self, stats: ModelStats, t_s: float) -> None:
        self.stats = stats
        self.full = Snapshot.of(stats, t_s)  # the latest full snapshot
        self.point_base = self.full  # what the next chart point is measured from
        self.seen_requests, self.seen_executions = self.full.requests, self.full.executions
        self.moved_t_s = float("-inf")
        self.marks: deque[Snapshot] | None = None  # baselines, only while active
        self.points: deque[Rates] | None = None
        self.state: object = None  # the version's state when last sampled (for events)

    @property
    def active(self) -> bool:
        return self.marks is not None

    def poll(self, t_s: float, previous_t_s: float) -> int:
        """Requests since the last poll (also > 0 for executions only); cheap when idle."""
        stats = self.stats
        requests, executions = stats.requests, stats.execution_count
        moved = requests - self.seen_requests
        if moved == 0 and executions == self.seen_executions:
            if self.marks is None:
                return 0
            if t_s - self.moved_t_s > WINDOW_S + MARK_EVERY_S:
                self.marks, self.full = None, Snapshot.of(stats, t_s)  # idle again
            elif t_s - self.marks[-1].t_s >= MARK_EVERY_S:
                self._mark(t_s)
            return 0
        self.seen_requests, self.seen_executions, self.moved_t_s = requests, executions, t_s
        if self.marks is None:  # the counters still equalled `full` at the previous poll
            self.full = replace(self.full, t_s=max(previous_t_s, self.full.t_s))
            self.marks = deque([self.full], maxlen=_MARKS)
            self.point_base = self.full
        if t_s - self.marks[-1].t_s >= MARK_EVERY_S:
            self._mark(t_s)
        return max(moved, 1)

    def add_point(self, t_s: float) -> None:
        """A per-second point for the chart: what happened since the last full snapshot."""
        snapshot = Snapshot.of(self.stats, t_s)
        if self.points is None:
            self.points = deque(maxlen=SERIES_POINTS)
        if snapshot.t_s > self.point_base.t_s:
            self.points.append(between(snapshot, self.point_base))
        self.point_base = snapshot

    def _mark(self, t_s: float) -> None:
        assert self.marks is not None
        self.full = Snapshot.of(self.stats, t_s)
        self.marks.append(self.full)

    def _baseline(self, t_s: float) -> Snapshot | None:
        if self.marks is None:
            return None
        baseline = self.marks[0]
        for mark in self.marks:
            if t_s - mark.t_s < WINDOW_S:
                break
            baseline = mark
        return baseline if baseline.t_s < t_s else None

    def recent(self, t_s: float) -> Rates | None:
        """The last ~10 s (None when idle that long); computed when asked, not per second."""
        baseline = self._baseline(t_s)
        return None if baseline is None else between(Snapshot.of(self.stats, t_s), baseline)

    def recent_requests_per_s(self, t_s: float) -> float:
        """Only the rate (cheap: what sorting thousands of rows needs)."""
        baseline = self._baseline(t_s)
        if baseline is None:
            return 0.0
        return (self.stats.requests - baseline.requests) / (t_s - baseline.t_s)

    def series(self, since_t_s: float) -> list[Rates]:
        return [p for p in self.points or () if p.t_s >= since_t_s]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
