"""A pipeline's steps checked against their models once loaded: a step mapping an input or
output its model lacks is refused at load, naming the step, the tensor and the model's own;
loops and readiness of nested pipelines, each model looked at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from serval.backends.base import ModelMetadata, ModelVersionSpec
from serval.errors import ConfigError, ModelNotFound
from serval.model_config import ModelConfig, PipelineStep
from serval.protocol.types import TensorSpec
from serval.repository.served import ModelState, ServedModel
from serval.repository.steps import check_no_loop, check_step_tensors, unready_steps

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


def test_a_step_taking_a_pipeline_input_in_another_datatype_is_refused() -> None:
    """Before: it loaded, and every request failed at the step (Triton refuses it at load)."""
    declared = ({"x": "INT32"}, {"y": "FP32"})
    with pytest.raises(ConfigError) as caught:
        check_step_tensors("pipe", [_step({"input": "x"}, {"probabilities": "y"})], _get,
                           declared)
    assert str(caught.value) == ("pipeline 'pipe' step 1 ('good') takes 'x' as input 'input' of "
                                 "FP32, but the pipeline's config declares it INT32")


def test_a_pipeline_output_made_in_another_datatype_is_refused() -> None:
    """Before: it loaded, and every request was a 500 (the output's datatype checked per
    answer)."""
    declared = ({"x": "FP32"}, {"y": "FP64"})
    with pytest.raises(ConfigError) as caught:
        check_step_tensors("pipe", [_step({"input": "x"}, {"probabilities": "y"})], _get,
                           declared)
    assert str(caught.value) == ("pipeline 'pipe' step 1 ('good') makes pipeline output 'y' as "
                                 "FP32 (its output 'probabilities'), but the pipeline's config "
                                 "declares it FP64")


def test_declared_datatypes_that_agree_pass() -> None:
    check_step_tensors("pipe", [_step({"input": "x"}, {"probabilities": "y"})], _get,
                       ({"x": "FP32"}, {"y": "FP32"}))


# --- nested pipelines whose steps name one model many times -----------------------------------

_DEPTH, _FAN = 12, 3  # pipeline p<k> has 3 steps on p<k-1>; p0 is a model: 3**12 paths


def _fan_steps(name: str) -> list[PipelineStep]:
    level = int(name.removeprefix("p"))
    return [PipelineStep(model=f"p{level - 1}", inputs={"x": "x"}, outputs={"y": "y"})
            ] * _FAN if level else []


def test_a_loop_check_walks_each_model_once_however_many_steps_name_it() -> None:
    """It walked every path: 3**12 calls here, minutes for pipelines of 100 steps three deep
    (a load that held the event loop, so health checks went unanswered meanwhile)."""
    asked: list[str] = []

    def steps(name: str) -> list[PipelineStep]:
        asked.append(name)
        return _fan_steps(name)

    check_no_loop(f"p{_DEPTH}", steps)
    assert sorted(asked) == sorted(f"p{level}" for level in range(_DEPTH + 1))

    def looping(name: str) -> list[PipelineStep]:  # p0 runs on p5: p5 -> ... -> p0 -> p5
        return [PipelineStep(model="p5", inputs={}, outputs={})] if name == "p0" else steps(name)

    with pytest.raises(ConfigError, match=r"pipeline steps loop: p12 -> .* -> p0 -> p5$"):
        check_no_loop(f"p{_DEPTH}", looping)


def test_readiness_of_nested_pipelines_looks_at_each_model_once() -> None:
    """A readiness check (every /v2/health/ready) walked every path to the steps' models."""
    spec_of = {f"p{level}": ModelVersionSpec(f"p{level}", "1", Path("/nowhere"), ModelConfig(
        backend="pipeline" if level else "onnxruntime", steps=_fan_steps(f"p{level}")))
        for level in range(_DEPTH + 1)}
    served = {name: ServedModel(name, "1", ModelState.READY, spec=spec)
              for name, spec in spec_of.items()}
    served["p0"].state, served["p0"].reason = ModelState.UNAVAILABLE, "unloaded"
    asked: list[str] = []

    def get(name: str, version: str | None) -> ServedModel:
        asked.append(name)
        return served[name]

    problems = unready_steps(served[f"p{_DEPTH}"], get)
    assert problems == [f"step {n} ('p0'): version 1 is UNAVAILABLE: unloaded"
                        for n in range(1, _FAN + 1)]
    assert len(asked) == _DEPTH * _FAN
