"""Triton's metric names: the text parses as Prometheus text (prometheus_client's parser) into
Triton's families, with the values of the statistics they are read from; the summed rest
(`_other`) carries the durations too; CPU metrics from a /proc of our own."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from serval.observability.metrics import ModelGauges, ModelSeries
from serval.observability.triton_metrics import CpuCollector, render_triton
from serval.stats import ModelStats

pytestmark = pytest.mark.unit
label_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
outcomes = st.sampled_from(["success", "overloaded", "deadline_exceeded", "cancelled",
                            "backend_error", "invalid_input", "model_not_ready"])


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(name, labels) -> value; a counter's sample by its name as written (the library's
    parser calls Triton's `nv_x` counter sample `nv_x_total`, as OpenMetrics would)."""
    return {(family.name if sample.name == f"{family.name}_total" else sample.name,
             tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


@st.composite
def model_views(draw: st.DrawFn) -> ModelGauges:
    stats = ModelStats(draw(label_text), draw(label_text))
    for outcome in draw(st.lists(outcomes, max_size=8)):
        stats.record_request(outcome, draw(st.integers(0, 10**10)))
    for _ in range(draw(st.integers(0, 3))):
        stats.record_queue(draw(st.integers(0, 10**9)))
        stats.record_execution(draw(st.integers(1, 64)), draw(st.integers(1, 8)),
                               draw(st.integers(0, 10**6)), draw(st.integers(0, 10**9)),
                               draw(st.integers(0, 10**6)))
    if draw(st.booleans()):
        stats.record_cache(draw(st.booleans()), draw(st.integers(0, 10**6)))
    return ModelGauges(stats, 0, 1, draw(st.integers(0, 500)), 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(model_views(), max_size=4, unique_by=lambda m: (m.stats.name, m.stats.version)))
def test_each_family_holds_the_statistics_it_is_read_from(models: list[ModelGauges]) -> None:
    samples = _samples(render_triton(models))
    reasons = {"overloaded": "REJECTED", "deadline_exceeded": "REJECTED",
               "model_not_ready": "REJECTED", "cancelled": "CANCELED",
               "backend_error": "BACKEND", "invalid_input": "OTHER"}
    for model in models:
        stats = model.stats
        labels = (("model", stats.name), ("version", stats.version))
        expected = {
            "nv_inference_request_success": stats.outcomes.get("success", 0),
            "nv_inference_count": stats.inference_count,
            "nv_inference_exec_count": stats.execution_count,
            "nv_inference_pending_request_count": model.pending_requests,
            "nv_inference_request_duration_us": stats.success.ns // 1000,
            "nv_inference_queue_duration_us": stats.queue.ns // 1000,
            "nv_inference_compute_input_duration_us": stats.compute_input.ns // 1000,
            "nv_inference_compute_infer_duration_us": stats.compute_infer.ns // 1000,
            "nv_inference_compute_output_duration_us": stats.compute_output.ns // 1000,
        }
        for name, value in expected.items():
            assert samples[(name, labels)] == value, name
        for reason in ("BACKEND", "CANCELED", "OTHER", "REJECTED"):
            failed = sum(count for outcome, count in stats.outcomes.items()
                         if reasons.get(outcome) == reason)
            key = ("nv_inference_request_failure",
                   (("model", stats.name), ("reason", reason), ("version", stats.version)))
            assert samples[key] == failed, reason
        if stats.cache_hit.count or stats.cache_miss.count:
            assert samples[("nv_cache_num_hits_per_model", labels)] == stats.cache_hit.count
            assert samples[("nv_cache_miss_duration_per_model", labels)] == \
                stats.cache_miss.ns // 1000


def test_the_families_are_typed_as_triton_types_them() -> None:
    stats = ModelStats("m", "1")
    stats.record_request("success", 5_000)
    text = render_triton([ModelGauges(stats, 0, 1, 3, 0)])
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert 'nv_inference_request_success{model="m",version="1"} 1.0\n' in text
    assert "# TYPE nv_inference_pending_request_count gauge\n" in text
    assert "nv_cache" not in text  # no model with a cache: no cache families


def test_the_summed_rest_carries_durations_as_the_top_models_do() -> None:
    totals = ModelStats("_all", "")
    busy, quiet = ModelStats("busy", "1", totals), ModelStats("quiet", "1", totals)
    for stats, requests in ((busy, 5), (quiet, 2)):
        for _ in range(requests):
            stats.record_queue(3_000)
            stats.record_execution(1, 1, 1_000, 20_000, 1_000)
            stats.record_request("success", 30_000)
    series = ModelSeries(lambda: [ModelGauges(busy, 0, 1, 0, 0),
                                  ModelGauges(quiet, 0, 1, 0, 0)], totals, top_k=1,
                         triton=True)
    samples = _samples(series.render())
    other = (("model", "_other"), ("version", ""))
    assert samples[("nv_inference_request_success", other)] == 2
    assert samples[("nv_inference_request_duration_us", other)] == 60
    assert samples[("nv_inference_queue_duration_us", other)] == 6
    assert samples[("nv_inference_compute_infer_duration_us", other)] == 40


def test_cpu_metrics_read_proc(tmp_path: Path) -> None:
    (tmp_path / "stat").write_text("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (tmp_path / "meminfo").write_text("MemTotal:       1000 kB\nMemFree:  10 kB\n"
                                      "MemAvailable:    400 kB\n")
    collector = CpuCollector(str(tmp_path))
    (tmp_path / "stat").write_text("cpu  200 0 200 800 100 0 0 0 0 0\n")  # 200 busy of 300
    values = {m.name: m.samples[0].value for m in collector.collect()}
    assert values["nv_cpu_utilization"] == pytest.approx(2 / 3)
    assert values["nv_cpu_memory_total_bytes"] == 1000 * 1024
    assert values["nv_cpu_memory_used_bytes"] == 600 * 1024
    assert CpuCollector(str(tmp_path / "absent")).collect() == []  # no /proc: nothing
