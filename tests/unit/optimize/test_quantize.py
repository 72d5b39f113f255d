"""Quantization on small real models: INT8 static (QDQ, per-channel, kept ops), its refusals,
FP16."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from serval.errors import ConfigError
from serval.optimize import convert, quantize, samples
from serval.optimize.quantize import QuantizeOptions
from tests import fixture_models
from tests.optimize_models import MLP_INPUT, run_onnx

pytestmark = pytest.mark.unit


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
    np.testing.assert_allclose(run_onnx(tmp_path / "h.onnx", feeds)[0],
                               run_onnx(converted.path, feeds)[0], atol=5e-3)
