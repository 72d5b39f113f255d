"""Activation smoothing before INT8: the FP32 function unchanged, an outlier channel's INT8 error
cut for real (ONNX Runtime's dynamic quantizer), shared weights and kept nodes left alone, and
its refusals."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from serval.errors import ConfigError
from serval.optimize import quantize, samples, smooth
from serval.optimize.quantize import QuantizeOptions
from tests.optimize_models import run_onnx, tiny_bert

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert") / "bert.onnx")


def _text_like(path: Path, items: int, seed: int) -> samples.Feeds:
    return samples.random_inputs(samples.input_specs(path), items, seed, 16)


def test_smoothing_keeps_the_fp32_function_and_scales_every_target(bert: Path,
                                                                     tmp_path: Path) -> None:
    original = onnx.load(str(bert))
    targets = smooth.targets(original)
    assert {n.op_type for n in targets} == {"MatMul"} and len(targets) >= 8
    result = smooth.smooth(bert, tmp_path / "s.onnx", _text_like(bert, 32, 1), 0.7)
    assert result.nodes == len(targets) and result.calibration_items == 32
    smoothed = onnx.load(str(tmp_path / "s.onnx"))
    producers = {out: n for n in smoothed.graph.node for out in n.output}
    for name in (n.name for n in targets):
        node = next(n for n in smoothed.graph.node if n.name == name)
        assert producers[node.input[0]].op_type == "Mul"  # its input divided by the scale
    weights = {w.name: numpy_helper.to_array(w) for w in original.graph.initializer}
    scaled = {w.name: numpy_helper.to_array(w) for w in smoothed.graph.initializer}
    assert any(not np.allclose(weights[n.input[1]], scaled[n.input[1]]) for n in targets)
    held_out = _text_like(bert, 16, 2)
    want, got = run_onnx(bert, held_out)[0], run_onnx(tmp_path / "s.onnx", held_out)[0]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def _outlier_matmul(path: Path, shared: bool = False, gemm: bool = False) -> Path:
    """x [B,64] @ W [64,32] (twice over one weight when shared); as a Gemm, W is stored
    transposed ([32,64], transB=1) as torch exports a Linear layer, with a bias."""
    rng = np.random.default_rng(0)
    matrix = rng.standard_normal((64, 32)).astype(np.float32)
    weight = numpy_helper.from_array(matrix.T.copy() if gemm else matrix, "w")
    nodes = [helper.make_node("Gemm", ["x", "w", "bias"], ["y"], name="first", transB=1)
             if gemm else helper.make_node("MatMul", ["x", "w"], ["y"], name="first")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 32])]
    if shared:
        nodes.append(helper.make_node("MatMul", ["x", "w"], ["z"], name="second"))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, ["b", 32]))
    graph = helper.make_graph(nodes, "outlier",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])],
                              outputs, [weight, numpy_helper.from_array(
                                  np.linspace(-1, 1, 32, dtype=np.float32), "bias")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _activations(items: int, seed: int) -> samples.Feeds:
    """Normal activations with channel 3 a hundred times larger, as after a LayerNorm."""
    x = np.random.default_rng(seed).standard_normal((items, 64)).astype(np.float32)
    x[:, 3] *= 100.0
    return {"x": x}


@pytest.mark.parametrize("gemm", [False, True], ids=["MatMul", "Gemm transB"])
def test_smoothing_cuts_the_int8_error_an_outlier_channel_causes(tmp_path: Path,
                                                                 gemm: bool) -> None:
    source = _outlier_matmul(tmp_path / "m.onnx", gemm=gemm)
    calibration, held_out = _activations(256, 1), _activations(256, 2)
    plain = quantize.quantize(source, tmp_path / "plain.onnx", QuantizeOptions("int8-dynamic"))
    smoothed = quantize.quantize(source, tmp_path / "smoothed.onnx",
                                 QuantizeOptions("int8-dynamic", smooth=0.5), calibration)
    assert plain.smoothing == "" and plain.calibration_items == 0
    assert smoothed.smoothing == "alpha 0.5 on the inputs of 1 nodes, from 256 calibration items"
    assert smoothed.calibration_items == 256
    assert not list(tmp_path.glob("*.smoothed.onnx"))  # the intermediate model is removed
    want = run_onnx(source, held_out)[0]
    smooth.smooth(source, tmp_path / "fp32.onnx", calibration, 0.5)
    np.testing.assert_allclose(run_onnx(tmp_path / "fp32.onnx", held_out)[0], want, rtol=1e-4,
                               atol=1e-3)  # the same function before quantization

    def error(path: Path) -> float:
        return float(np.abs(run_onnx(path, held_out)[0] - want).mean())

    assert error(tmp_path / "smoothed.onnx") < 0.5 * error(tmp_path / "plain.onnx")


def test_a_shared_weight_and_a_skipped_node_are_left_alone(tmp_path: Path) -> None:
    shared = _outlier_matmul(tmp_path / "shared.onnx", shared=True)
    assert smooth.targets(onnx.load(str(shared))) == []
    single = _outlier_matmul(tmp_path / "single.onnx")
    result = smooth.smooth(single, tmp_path / "s.onnx", _activations(8, 1), 0.5, skip=("first",))
    assert result.nodes == 0
    assert [n.op_type for n in onnx.load(str(tmp_path / "s.onnx")).graph.node] == ["MatMul"]


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.5, math.nan])
def test_an_alpha_outside_zero_to_one_is_refused(alpha: float) -> None:
    with pytest.raises(ConfigError, match="expected a number between 0 and 1"):
        smooth.check(alpha, "int8-dynamic")


def test_smoothing_without_calibration_or_for_fp16_is_refused(tmp_path: Path) -> None:
    source = _outlier_matmul(tmp_path / "m.onnx")
    with pytest.raises(ConfigError, match="--smooth needs calibration data"):
        quantize.quantize(source, tmp_path / "q.onnx", QuantizeOptions("int8-dynamic",
                                                                       smooth=0.5))
    with pytest.raises(ConfigError, match="--smooth applies to INT8"):
        quantize.quantize(source, tmp_path / "q.onnx", QuantizeOptions("fp16", smooth=0.5),
                          _activations(8, 1))
