"""Conversion to ONNX on small real models (torch, TorchScript, scikit-learn) and its precise
errors for bad sources and input specs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from serval.errors import ConfigError
from serval.optimize import convert, samples
from serval.protocol.types import TensorSpec
from tests import optimize_models
from tests.optimize_models import MLP_INPUT, run_onnx

pytestmark = pytest.mark.unit


def test_torch_factory_converts_with_a_dynamic_batch_and_matches_torch(tmp_path: Path) -> None:
    converted = convert.convert("tests.optimize_models:tiny_mlp", tmp_path / "m.onnx",
                                MLP_INPUT, ["probabilities"])
    specs = samples.input_specs(converted.path)
    assert [s.tensor for s in specs] == [TensorSpec("x", "FP32", (-1, 16))]
    for batch in (1, 7):
        feeds = samples.random_inputs(specs, batch, seed=batch)
        (got,) = run_onnx(converted.path, feeds)
        want = converted.reference(feeds)["probabilities"]
        assert got.shape == (batch, 10)
        np.testing.assert_allclose(got, want, atol=1e-5)


def test_torchscript_file_converts(tmp_path: Path) -> None:
    scripted = torch.jit.script(optimize_models.tiny_mlp())
    scripted.save(str(tmp_path / "m.pt"))
    converted = convert.convert(str(tmp_path / "m.pt"), tmp_path / "m.onnx", MLP_INPUT, [])
    feeds = samples.random_inputs(samples.input_specs(converted.path), 5, seed=0)
    np.testing.assert_allclose(run_onnx(converted.path, feeds)[0],
                               converted.reference(feeds)["output"], atol=1e-5)


def test_sklearn_pipeline_converts_labels_and_probabilities(tmp_path: Path) -> None:
    pickled = optimize_models.sklearn_pipeline(tmp_path / "pipe.pkl")
    converted = convert.convert(str(pickled), tmp_path / "m.onnx", [], [])
    assert converted.kind == "sklearn"
    feeds = samples.random_inputs(samples.input_specs(converted.path), 64, seed=0)
    labels, probabilities = run_onnx(converted.path, feeds)
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
