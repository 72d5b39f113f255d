"""The whole `serval optimize` run: every step, parity and cost in the report; parity failing
an outlier model."""

from __future__ import annotations

from pathlib import Path

import pytest

from serval.optimize import report, run
from serval.optimize.parity import Thresholds
from serval.optimize.quantize import QuantizeOptions
from tests.optimize_models import MLP_INPUT

pytestmark = pytest.mark.unit


def test_pipeline_report_has_every_step_parity_and_cost(tmp_path: Path) -> None:
    request = run.Request(source="tests.optimize_models:tiny_mlp", out=tmp_path / "out",
                          inputs=MLP_INPUT, output_names=["probabilities"], optimize_graph=True,
                          quantize=QuantizeOptions("int8-dynamic"), parity_items=500,
                          measure_duration_s=0.2, threads=1)
    outcome = run.run(request)
    doc = outcome.report
    assert outcome.passed and outcome.model == tmp_path / "out" / "model.onnx"
    assert [s["step"] for s in doc["steps"]] == ["convert", "optimize-graph", "quantize"]
    assert doc["steps"][2]["mode"] == "int8-dynamic"
    figures = doc["parity"]["outputs"][0]
    assert doc["parity"]["inputs"] == {"kind": "random valid inputs from the model's metadata",
                                       "items": 500}
    assert figures["name"] == "probabilities" and figures["top1_agreement"] >= 0.99
    assert doc["parity"]["reference"] == "torch (tests.optimize_models:tiny_mlp)"
    assert doc["measure"]["before"]["size_bytes"] > doc["measure"]["after"]["size_bytes"]
    assert doc["measure"]["after"]["throughput_items_per_s"] > 0
    page = report.markdown(doc)
    assert "Parity: **PASSED** on 500 items" in page and "| probabilities | 500 |" in page
    assert (tmp_path / "out" / "report.json").is_file()
    assert (tmp_path / "out" / "report.md").read_text() == page
    assert not list((tmp_path / "out").glob(".serval-optimize-*"))  # work files cleaned


def test_outlier_weights_break_int8_and_parity_says_so(tmp_path: Path) -> None:
    request = run.Request(source="tests.optimize_models:outlier_mlp", out=tmp_path / "out",
                          inputs=MLP_INPUT, quantize=QuantizeOptions("int8-dynamic"),
                          thresholds=Thresholds(min_top1=0.99), measure=False)
    outcome = run.run(request)
    assert not outcome.passed
    assert outcome.report["parity"]["passed"] is False
    figures = outcome.report["parity"]["outputs"][0]
    assert figures["top1_agreement"] < 0.9  # the argmax collapsed, as intended
    assert any("top-1 agreement" in f for f in outcome.report["parity"]["failures"])
