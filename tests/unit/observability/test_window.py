"""Recent rates and percentiles from diffed snapshots of a version's counters (VersionWindow)."""

from __future__ import annotations

import pytest

from serval.observability.window import WINDOW_S, VersionWindow, quantile
from serval.stats import LATENCY_BUCKETS_S, ModelStats

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
    assert window.poll(1.0, 0.0) == 0 and not window.active  # nothing moved
    _serve(stats, 10, 0.002, errors=2)
    assert window.poll(2.0, 1.0) == 10 and window.active
    window.add_point(2.0)
    point = window.points[-1]  # type: ignore[index]
    assert point.requests_per_s == 10.0 and point.errors_per_s == 2.0  # over (1 s, 2 s]
    assert point.batch_mean == 10 and 1 < point.p50_ms <= 2.5  # type: ignore[operator]
    for second in range(3, 8):
        _serve(stats, 20, 0.02)
        assert window.poll(float(second), second - 1.0) == 20
        window.add_point(float(second))
    assert window.points is not None and len(window.points) == 6
    recent = window.recent(7.0)
    assert recent is not None and recent.p99_ms > 10  # type: ignore[operator]
    assert recent.requests_per_s == pytest.approx(110 / 6)
    assert window.recent_requests_per_s(7.0) == pytest.approx(110 / 6)
    t = 7.0 + WINDOW_S + 3
    assert window.poll(t, t - 1) == 0 and not window.active  # idle past the window
    assert window.recent(t) is None and window.recent_requests_per_s(t) == 0.0
    assert [p.t_s for p in window.series(5.0)] == [5.0, 6.0, 7.0]
    _serve(stats, 5, 0.001)  # active again: measured from the previous poll, not from t=7
    assert window.poll(t + 1, t) == 5
    window.add_point(t + 1)
    assert window.points[-1].requests_per_s == 5.0
