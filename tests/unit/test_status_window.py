"""Recent rates and percentiles from diffed snapshots of a model's counters (no server)."""

from __future__ import annotations

import pytest

from serval.observability.stats import LATENCY_BUCKETS_S, ModelStats
from serval.observability.window import WINDOW_S, VersionWindow, quantile

pytestmark = pytest.mark.unit


def test_quantile_interpolates_within_a_bucket_like_prometheus() -> None:
    counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
    counts[3] = 100  # (0.5 ms, 1 ms]
    assert quantile(0.5, counts) == pytest.approx(0.00075)
    assert quantile(0.99, counts) == pytest.approx(0.000995)
    assert quantile(0.5, [0] * len(counts)) is None
    counts[-1] = 1000  # past the last bound: the highest finite bound, as Prometheus
    assert quantile(0.99, counts) == LATENCY_BUCKETS_S[-1]


def _serve(stats: ModelStats, requests: int, seconds: float, errors: int = 0) -> None:
    for index in range(requests):
        stats.record_request("INVALID_INPUT" if index < errors else "success",
                             int(seconds * 1e9))
    stats.record_execution(requests, requests, 0, int(seconds * 1e9), 0)


def test_points_per_second_and_a_recent_window_that_goes_idle() -> None:
    stats = ModelStats("m", "1")
    window = VersionWindow(stats, 0.0)
    assert not window.sample(1.0) and window.points is None  # nothing moved: no point
    _serve(stats, 10, 0.002, errors=2)
    assert window.sample(2.0)
    point = window.points[-1]  # type: ignore[index]
    assert point.requests_per_s == 5.0 and point.errors_per_s == 1.0  # over (0 s, 2 s]
    assert point.batch_mean == 10 and 1 < point.p50_ms <= 2.5  # type: ignore[operator]
    for second in range(3, 8):
        _serve(stats, 20, 0.02)
        window.sample(float(second))
    assert window.points is not None and len(window.points) == 6
    assert window.recent is not None and window.recent.p99_ms > 10  # type: ignore[operator]
    assert window.recent.requests_per_s == pytest.approx(110 / 7)
    t = 7.0 + WINDOW_S + 3
    assert not window.sample(t) and window.recent is None  # idle past the window
    assert [p.t_s for p in window.series(5.0)] == [5.0, 6.0, 7.0]
