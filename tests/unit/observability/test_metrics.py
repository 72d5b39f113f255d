"""Prometheus families from model counters: bounded cardinality with many models."""

from __future__ import annotations

import pytest

from serval.observability.metrics import OTHER_MODELS, Exposition, ModelGauges, ModelSeries
from serval.stats import ModelStats

pytestmark = pytest.mark.unit


TOTALS = ModelStats("_all", "")


def _model(name: str, requests: int, totals: ModelStats = TOTALS) -> ModelGauges:
    stats = ModelStats(name, "1", totals)
    for _ in range(requests):
        stats.record_request("success", 1_000_000)
    stats.record_execution(rows=requests, requests=requests, input_ns=1, infer_ns=1, output_ns=1)
    return ModelGauges(stats, memory_bytes=10, ready=True, pending_requests=0,
                       running_batches=0)


def test_only_the_busiest_models_get_their_own_series() -> None:
    totals = ModelStats("_all", "")
    models = [_model(f"m{i}", requests=i, totals=totals) for i in range(1, 51)]
    text = Exposition(ModelSeries(lambda: models, totals, top_k=5)).render()
    lines = text.decode().splitlines()
    named = {line.split('model="')[1].split('"')[0] for line in lines if 'model="' in line}
    assert named == {"m46", "m47", "m48", "m49", "m50", OTHER_MODELS}
    other = f'serval_requests_total{{model="{OTHER_MODELS}",outcome="success",version=""}}'
    assert f"{other} {float(sum(range(1, 46)))}" in lines  # exact sum of the other 45
    count = f'serval_request_duration_seconds_count{{model="{OTHER_MODELS}",version=""}}'
    assert f"{count} {float(sum(range(1, 46)))}" in lines
    assert f'serval_model_memory_bytes{{model="{OTHER_MODELS}",version=""}} 450.0' in lines


def test_few_models_are_all_listed() -> None:
    models = [_model("a", 1), _model("b", 2)]
    text = Exposition(ModelSeries(lambda: models, TOTALS, top_k=5)).render()
    assert OTHER_MODELS not in text.decode()
