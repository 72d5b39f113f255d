"""Each `serval optimize` step on small real models: conversion (torch, TorchScript,
scikit-learn), generated inputs, graph optimization (a tiny BERT), INT8 / FP16, the report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from serval.errors import ConfigError
from serval.optimize import convert, graph, quantize, report, run, samples
from serval.optimize.parity import Thresholds
from serval.optimize.quantize import QuantizeOptions
from tests import fixture_models, optimize_models

pytestmark = pytest.mark.unit

MLP_INPUT = [convert.parse_input("x:float32:16")]


def _ops(path: Path) -> list[str]:
    return [node.op_type for node in onnx.load(str(path)).graph.node]


def _run_onnx(path: Path, feeds: samples.Feeds) -> list[np.ndarray]:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_torch_factory_converts_with_a_dynamic_batch_and_matches_torch(tmp_path: Path) -> None:
    converted = convert.convert("tests.optimize_models:tiny_mlp", tmp_path / "m.onnx",
                                MLP_INPUT, ["probabilities"])
    specs = samples.input_specs(converted.path)
    assert [(s.name, s.dims) for s in specs] == [("x", (None, 16))]
    for batch in (1, 7):
        feeds = samples.random_inputs(specs, batch, seed=batch)
        (got,) = _run_onnx(converted.path, feeds)
        want = converted.reference(feeds)["probabilities"]
        assert got.shape == (batch, 10)
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_torchscript_file_converts(tmp_path: Path) -> None:
    scripted = torch.jit.script(optimize_models.tiny_mlp())
    scripted.save(str(tmp_path / "m.pt"))
    converted = convert.convert(str(tmp_path / "m.pt"), tmp_path / "m.onnx", MLP_INPUT, [])
    feeds = samples.random_inputs(samples.input_specs(converted.path), 5, seed=0)
    np.testing.assert_allclose(_run_onnx(converted.path, feeds)[0],
                               converted.reference(feeds)["output"], atol=1e-5)


def test_sklearn_pipeline_converts_labels_and_probabilities(tmp_path: Path) -> None:
    pickled = optimize_models.sklearn_pipeline(tmp_path / "pipe.pkl")
    converted = convert.convert(str(pickled), tmp_path / "m.onnx", [], [])
    assert converted.kind == "sklearn"
    feeds = samples.random_inputs(samples.input_specs(converted.path), 64, seed=0)
    labels, probabilities = _run_onnx(converted.path, feeds)
    want = converted.reference(feeds)
    assert list(want) == ["label", "probabilities"]
    np.testing.assert_array_equal(labels, want["label"])
    np.testing.assert_allclose(probabilities, want["probabilities"], atol=1e-5)


@pytest.mark.parametrize(("source", "reason"), [
    ("tests.optimize_models:not_a_module", "not a torch nn.Module"),
    ("tests.optimize_models:missing", "cannot import the factory"),
    ("model.h5", "expected a .onnx file"),
])
def test_bad_sources_get_precise_errors(tmp_path: Path, source: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        convert.convert(source, tmp_path / "m.onnx", MLP_INPUT, [])


def test_input_spec_errors_say_what_is_expected() -> None:
    assert convert.parse_input("ids:int64:4:8") == convert.TensorArg("ids", "int64", (4, 8))
    with pytest.raises(ConfigError, match=r"NAME:DTYPE\[:DIM...\]"):
        convert.parse_input("ids:int7:4")


def test_generated_ids_stay_inside_the_embedding_table(tmp_path: Path) -> None:
    bert = optimize_models.tiny_bert(tmp_path / "bert.onnx")
    specs = {s.name: s for s in samples.input_specs(bert)}
    assert specs["input_ids"].int_high == 500
    feeds = samples.random_inputs(list(specs.values()), 64, seed=0, sequence=16)
    assert feeds["input_ids"].max() < 500 and feeds["input_ids"].shape == (64, 16)
    mask = feeds["attention_mask"]
    assert set(np.unique(mask)) <= {0, 1} and (mask[:, 0] == 1).all()
    assert (np.diff(mask, axis=1) <= 0).all()  # prefix masks: ones, then zeros


def test_transformer_optimizer_fuses_a_tiny_bert(tmp_path: Path) -> None:
    bert = optimize_models.tiny_bert(tmp_path / "bert.onnx")
    assert graph.detect_attention(onnx.load(str(bert))) == (4, 64)
    result = graph.optimize_graph(bert, tmp_path / "fused.onnx")
    assert result.method.startswith("onnxruntime transformer optimizer (bert, 4 heads")
    assert result.fused.get("Attention") == 2 and result.fused.get("SkipLayerNormalization")
    assert result.nodes_after < result.nodes_before
    feeds = samples.random_inputs(samples.input_specs(bert), 4, seed=0, sequence=16)
    np.testing.assert_allclose(_run_onnx(tmp_path / "fused.onnx", feeds)[0],
                               _run_onnx(bert, feeds)[0], atol=1e-4)


def test_ort_offline_optimization_for_other_models(tmp_path: Path) -> None:
    converted = convert.convert("tests.optimize_models:tiny_mlp", tmp_path / "m.onnx",
                                MLP_INPUT, [])
    result = graph.optimize_graph(converted.path, tmp_path / "g.onnx")
    assert result.method == "onnxruntime extended" and result.nodes_after <= result.nodes_before
    assert "Gemm" in _ops(tmp_path / "g.onnx") or "FusedGemm" in _ops(tmp_path / "g.onnx")


def test_int8_static_is_qdq_per_channel_and_keeps_softmax(tmp_path: Path) -> None:
    converted = convert.convert("tests.optimize_models:tiny_mlp", tmp_path / "m.onnx",
                                MLP_INPUT, [])
    calibration = samples.random_inputs(samples.input_specs(converted.path), 32, seed=5)
    result = quantize.quantize(converted.path, tmp_path / "q.onnx",
                               QuantizeOptions("int8-static", per_channel=True,
                                               exclude_ops=("Softmax",)), calibration)
    assert result.format == "QDQ (per-channel weights)" and result.calibration_items == 32
    model = onnx.load(str(tmp_path / "q.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuantizeLinear") >= 2 and ops.count("DequantizeLinear") >= 2
    assert _softmax_output_consumers(model) == []  # kept in FP32: its output is not requantized
    quantize.quantize(converted.path, tmp_path / "all.onnx",
                      QuantizeOptions("int8-static", per_channel=True), calibration)
    assert _softmax_output_consumers(onnx.load(str(tmp_path / "all.onnx"))) == ["QuantizeLinear"]
    scales = [i for i in model.graph.initializer if "scale" in i.name and len(i.dims) == 1]
    assert scales, "per-channel weights carry one scale per output channel"


def _softmax_output_consumers(model: onnx.ModelProto) -> list[str]:
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    return [n.op_type for n in model.graph.node if softmax.output[0] in n.input]


def test_int8_static_without_calibration_is_refused(tmp_path: Path) -> None:
    path = fixture_models.linear(tmp_path)
    with pytest.raises(ConfigError, match="needs calibration data"):
        quantize.quantize(path, tmp_path / "q.onnx", QuantizeOptions("int8-static"), None)
    with pytest.raises(ConfigError, match="no node of that name"):
        quantize.quantize(path, tmp_path / "q.onnx",
                          QuantizeOptions("int8-dynamic", exclude_nodes=("nope",)))


def test_fp16_keeps_fp32_inputs_and_outputs(tmp_path: Path) -> None:
    converted = convert.convert("tests.optimize_models:tiny_mlp", tmp_path / "m.onnx",
                                MLP_INPUT, [])
    quantize.quantize(converted.path, tmp_path / "h.onnx", QuantizeOptions("fp16"))
    model = onnx.load(str(tmp_path / "h.onnx"))
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert {i.data_type for i in model.graph.initializer} == {onnx.TensorProto.FLOAT16}
    feeds = samples.random_inputs(samples.input_specs(converted.path), 8, seed=0)
    np.testing.assert_allclose(_run_onnx(tmp_path / "h.onnx", feeds)[0],
                               _run_onnx(converted.path, feeds)[0], atol=5e-3)


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


def test_shipped_sentences_are_a_few_hundred_distinct_lines() -> None:
    texts = samples.sentences()
    assert len(texts) >= 250 and len(set(texts)) == len(texts)
