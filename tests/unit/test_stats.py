"""Per-model statistics: Triton's statistics extension shape and Prometheus-style histograms."""

from __future__ import annotations

import json

import pytest

from serval.stats import LATENCY_BUCKETS_S, Histogram, ModelStats

pytestmark = pytest.mark.unit

DURATION_KEYS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


def test_fresh_stats_report_zeros_in_triton_shape() -> None:
    stats = ModelStats("m", "2").as_triton_dict()
    assert stats["name"] == "m" and stats["version"] == "2"
    assert stats["inference_count"] == 0 and stats["execution_count"] == 0
    assert stats["last_inference"] == 0
    inference_stats = stats["inference_stats"]
    assert isinstance(inference_stats, dict)
    for key in DURATION_KEYS:
        assert inference_stats[key] == {"count": 0, "ns": 0}
    assert stats["batch_stats"] == []


def test_executions_count_rows_and_batches_per_size() -> None:
    stats = ModelStats("m", "1")
    stats.record_execution(rows=4, requests=2, input_ns=10, infer_ns=100, output_ns=1)
    stats.record_execution(rows=1, requests=1, input_ns=20, infer_ns=200, output_ns=2)
    stats.record_execution(rows=4, requests=3, input_ns=30, infer_ns=300, output_ns=3)
    report = stats.as_triton_dict()
    assert report["inference_count"] == 9
    assert report["execution_count"] == 3
    assert isinstance(report["last_inference"], int) and report["last_inference"] > 0
    inference_stats = report["inference_stats"]
    assert isinstance(inference_stats, dict)
    # Per-request compute: counted once per request of the batch, ns once per execution.
    assert inference_stats["compute_input"] == {"count": 6, "ns": 60}
    assert inference_stats["compute_infer"] == {"count": 6, "ns": 600}
    assert inference_stats["compute_output"] == {"count": 6, "ns": 6}
    assert report["batch_stats"] == [
        {"batch_size": 1, "compute_input": {"count": 1, "ns": 20},
         "compute_infer": {"count": 1, "ns": 200}, "compute_output": {"count": 1, "ns": 2}},
        {"batch_size": 4, "compute_input": {"count": 2, "ns": 40},
         "compute_infer": {"count": 2, "ns": 400}, "compute_output": {"count": 2, "ns": 4}},
    ]
    assert stats.batch_size.count == 3 and stats.batch_size.sum == 9
    assert stats.compute_seconds.count == 3


def test_requests_split_into_success_and_fail_by_outcome() -> None:
    stats = ModelStats("m", "1")
    stats.record_request("success", 1_000)
    stats.record_request("success", 3_000)
    stats.record_request("deadline_exceeded", 500)
    stats.record_request("invalid_input", 7)
    inference_stats = stats.as_triton_dict()["inference_stats"]
    assert isinstance(inference_stats, dict)
    assert inference_stats["success"] == {"count": 2, "ns": 4_000}
    assert inference_stats["fail"] == {"count": 2, "ns": 507}
    assert stats.outcomes == {"success": 2, "deadline_exceeded": 1, "invalid_input": 1}
    assert stats.request_seconds.count == 4
    assert stats.request_seconds.sum == pytest.approx(4_507e-9)
    # Requests alone do not count as inferences.
    assert stats.inference_count == 0


def test_queue_time_is_recorded_per_request() -> None:
    stats = ModelStats("m", "1")
    stats.record_queue(2_000_000)
    stats.record_queue(0)
    inference_stats = stats.as_triton_dict()["inference_stats"]
    assert isinstance(inference_stats, dict)
    assert inference_stats["queue"] == {"count": 2, "ns": 2_000_000}
    assert stats.queue_seconds.cumulative()[0] == (repr(LATENCY_BUCKETS_S[0]), 1)


def test_triton_dict_is_json_serialisable() -> None:
    stats = ModelStats("m", "1")
    stats.record_execution(2, 2, 1, 2, 3)
    stats.record_request("success", 10)
    assert json.loads(json.dumps(stats.as_triton_dict()))["inference_count"] == 2


def test_histogram_cumulative_counts_values_at_or_below_each_bound() -> None:
    histogram = Histogram((1.0, 2.0, 5.0))
    for value in (0.5, 1.0, 1.5, 2.0, 7.0, 0.0):
        histogram.observe(value)
    assert histogram.counts == [3, 2, 0, 1]
    assert histogram.cumulative() == [("1.0", 3), ("2.0", 5), ("5.0", 5), ("+Inf", 6)]
    assert histogram.count == 6
    assert histogram.sum == pytest.approx(12.0)


def test_histogram_cumulative_is_monotonic_and_ends_with_the_count() -> None:
    histogram = Histogram(LATENCY_BUCKETS_S)
    values = [0.00005, 0.0003, 0.0003, 0.02, 0.7, 3.0, 60.0]
    for value in values:
        histogram.observe(value)
    pairs = histogram.cumulative()
    counts = [count for _, count in pairs]
    assert len(pairs) == len(LATENCY_BUCKETS_S) + 1
    assert counts == sorted(counts)
    assert pairs[-1] == ("+Inf", len(values))
    assert [le for le, _ in pairs[:-1]] == [repr(b) for b in LATENCY_BUCKETS_S]


def test_empty_histogram_is_all_zero() -> None:
    assert Histogram((1.0,)).cumulative() == [("1.0", 0), ("+Inf", 0)]


def test_a_refusal_is_counted_but_kept_out_of_the_latency_histograms() -> None:
    totals = ModelStats("*", "")
    stats = ModelStats("m", "1", totals=totals)
    stats.record_request("success", 5_000_000)
    stats.record_refusal("overloaded")
    assert stats.outcomes == {"success": 1, "overloaded": 1} and stats.requests == 2
    assert stats.as_triton_dict()["inference_stats"]["fail"]["count"] == 1  # type: ignore[index]
    for histogram in (stats.request_seconds, totals.request_seconds):
        assert histogram.count == 1 and histogram.sum == pytest.approx(0.005)
    assert totals.outcomes == {"success": 1, "overloaded": 1}
