"""The hand-written per-model exposition against prometheus_client's own: the same families
built with the library's MetricFamily classes and written by `generate_latest` (what Serval
did before; bench/metrics_render.py keeps it as the baseline) must come out byte for byte
equal, on random counters, names and label values."""

from __future__ import annotations

import pytest
from bench.metrics_render import library_text
from hypothesis import given, settings
from hypothesis import strategies as st

from serval.observability.exposition import number, render_models
from serval.observability.metrics import ModelGauges
from serval.stats import ModelStats

pytestmark = pytest.mark.unit


label_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
counts = st.integers(0, 3_000_000_000)


@st.composite
def model_views(draw: st.DrawFn) -> ModelGauges:
    stats = ModelStats(draw(label_text), draw(label_text))
    for outcome in draw(st.lists(label_text, max_size=3)):
        stats.outcomes[outcome] = draw(counts)
    for step in draw(st.lists(label_text, max_size=2)):
        stats.record_step(step, draw(counts))
    for _ in range(draw(st.integers(0, 4))):
        stats.record_request("success", draw(st.integers(0, 20_000_000_000)))
        stats.record_queue(draw(st.integers(0, 2_000_000)))
        stats.record_execution(draw(st.integers(1, 2048)), 1, 1, draw(counts), 1)
    stats.inference_count += draw(counts)
    stats.execution_count += draw(counts)
    stats.request_seconds.counts[draw(st.integers(0, 16))] += draw(counts)
    if draw(st.booleans()):
        stats.record_cache(draw(st.booleans()), 5)
        stats.cache_miss.count += draw(counts)
    return ModelGauges(stats, memory_bytes=draw(st.integers(0, 1 << 40)),
                       ready=draw(st.integers(0, 5)), pending_requests=draw(counts),
                       running_batches=draw(st.integers(0, 8)))


@settings(max_examples=300, deadline=None)
@given(st.lists(model_views(), max_size=5))
def test_the_exposition_is_what_prometheus_client_writes(models: list[ModelGauges]) -> None:
    assert render_models(models) == library_text(models)


def test_odd_names_are_escaped_as_the_library_escapes_them() -> None:
    stats = ModelStats('a"b\\c\nd', "1")
    stats.record_request('x"y', 1_000)
    models = [ModelGauges(stats, 1, 1, 0, 0)]
    text = render_models(models)
    assert r'model="a\"b\\c\nd"' in text and r'outcome="x\"y"' in text
    assert text == library_text(models)


@pytest.mark.parametrize("value", [0, 3, -7, 999_999, 1_000_000, 123_456_789, 2**63, 0.5,
                                   1e-9, 1234567.5, float("inf"), True])
def test_numbers_are_written_as_the_library_writes_them(value: float) -> None:
    from prometheus_client.utils import floatToGoString

    assert number(value) == floatToGoString(value)
