"""A pipeline's steps checked against their models once loaded: a step mapping an input or
output its model lacks is refused at load, naming the step, the tensor and the model's own."""

from __future__ import annotations

import pytest

from serval.backends.base import ModelMetadata
from serval.errors import ConfigError, ModelNotFound
from serval.model_config import PipelineStep
from serval.protocol.types import TensorSpec
from serval.repository.served import ModelState, ServedModel
from serval.repository.steps import check_step_tensors

pytestmark = pytest.mark.unit


class _Loaded:
    metadata = ModelMetadata(
        "onnxruntime_onnx", (TensorSpec("input", "FP32", (-1, 256)),),
        (TensorSpec("probabilities", "FP32", (-1, 16)),), 8)

    def memory_bytes(self) -> int:
        return 0

    def unload(self) -> None:
        return None


def _get(name: str, version: str | None) -> ServedModel:
    if name != "good":
        raise ModelNotFound(f"no model '{name}'")
    return ServedModel(name, "1", ModelState.READY, model=_Loaded())


def _step(inputs: dict[str, str], outputs: dict[str, str]) -> PipelineStep:
    return PipelineStep(model="good", inputs=inputs, outputs=outputs)


def test_a_step_mapping_an_input_its_model_lacks_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        check_step_tensors("pipe", [_step({"nosuch": "x"}, {"probabilities": "y"})], _get)
    assert str(caught.value) == ("pipeline 'pipe' step 1 ('good') maps input 'nosuch', which "
                                 "model 'good' does not have (its inputs: 'input')")


def test_a_step_mapping_an_output_its_model_lacks_is_refused() -> None:
    steps = [_step({"input": "x"}, {"probabilities": "p"}), _step({"input": "x"}, {"zz": "y"})]
    with pytest.raises(ConfigError, match=r"step 2 \('good'\) maps output 'zz', which model "
                                          r"'good' does not have \(its outputs: "
                                          r"'probabilities'\)"):
        check_step_tensors("pipe", steps, _get)


def test_a_well_wired_step_passes() -> None:
    check_step_tensors("pipe", [_step({"input": "x"}, {"probabilities": "y"})], _get)
    unloaded = [PipelineStep(model="gone", inputs={"a": "x"}, outputs={"b": "y"})]
    check_step_tensors("pipe", unloaded, _get)  # its own load reports a missing model
