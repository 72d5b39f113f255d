"""Graph optimization: the transformer optimizer fuses a tiny BERT; ONNX Runtime's offline
passes for other models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from serval.optimize import convert, graph, samples
from tests import optimize_models
from tests.optimize_models import MLP_INPUT, op_types, run_onnx

pytestmark = pytest.mark.unit


def test_transformer_optimizer_fuses_a_tiny_bert(tmp_path: Path) -> None:
    bert = optimize_models.tiny_bert(tmp_path / "bert.onnx")
    assert graph.detect_attention(onnx.load(str(bert))) == (4, 64)
    result = graph.optimize_graph(bert, tmp_path / "fused.onnx")
    assert result.method.startswith("onnxruntime transformer optimizer (bert, 4 heads")
    assert result.fused.get("Attention") == 2 and result.fused.get("SkipLayerNormalization")
    assert result.nodes_after < result.nodes_before
    feeds = samples.random_inputs(samples.input_specs(bert), 4, seed=0, sequence=16)
    np.testing.assert_allclose(run_onnx(tmp_path / "fused.onnx", feeds)[0],
                               run_onnx(bert, feeds)[0], atol=1e-4)


def test_ort_offline_optimization_for_other_models(tmp_path: Path) -> None:
    converted = convert.convert("tests.optimize_models:tiny_mlp", tmp_path / "m.onnx",
                                MLP_INPUT, [])
    result = graph.optimize_graph(converted.path, tmp_path / "g.onnx")
    assert result.method == "onnxruntime extended" and result.nodes_after <= result.nodes_before
    assert "Gemm" in op_types(tmp_path / "g.onnx") or "FusedGemm" in op_types(tmp_path / "g.onnx")
