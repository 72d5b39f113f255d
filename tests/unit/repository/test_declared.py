"""A config's tensors (config.pbtxt or config.yaml) over an engine's own: checked at load,
served as declared, reshaped in and out."""

from __future__ import annotations

import numpy as np
import pytest

from serval.backends.base import ModelMetadata
from serval.errors import ConfigError, EngineRejectedInput
from serval.model_config import ModelConfig
from serval.protocol.types import TensorDict, TensorSpec
from serval.repository.declared import as_declared, fits

pytestmark = pytest.mark.unit


class Flat:
    """An engine model over [B,16] FP32 that echoes x as y and records what it was given."""

    def __init__(self, max_batch_size: int = 8) -> None:
        batch = (-1,) if max_batch_size else ()
        self.metadata = ModelMetadata("onnxruntime_onnx",
                                      (TensorSpec("x", "FP32", (*batch, 16)),),
                                      (TensorSpec("y", "FP32", (*batch, 16)),), max_batch_size)
        self.seen: list[tuple[int, ...]] = []

    def infer(self, inputs: TensorDict) -> TensorDict:
        self.seen.append(inputs["x"].shape)
        return {"y": inputs["x"]}

    def memory_bytes(self) -> int:
        return 1

    def unload(self) -> None:
        return None


def _config(inputs: list[dict[str, object]], outputs: list[dict[str, object]] | None = None,
            backend: str = "onnxruntime") -> ModelConfig:
    return ModelConfig.model_validate({"backend": backend, "inputs": inputs,
                                       "outputs": outputs or [], "triton": {}})


def test_a_config_that_declares_nothing_serves_the_engine_as_it_reads_it() -> None:
    model = Flat()
    assert as_declared(model, ModelConfig.model_validate({}), "m/config.pbtxt") is model


@pytest.mark.parametrize(("tensors", "named"), [
    ({"inputs": [{"name": "nope", "datatype": "INT8", "dims": [3]}]},
     "m/config.yaml: input 'nope' is not an input of the model (it has x)"),
    ({"inputs": [{"name": "x", "datatype": "INT8", "dims": [16]}]},
     "m/config.yaml: input 'x': data_type INT8 in the config, the model has FP32"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "dims": [3]}]},
     "m/config.yaml: input 'x': dims [3] do not fit the model's shape [-1, 16]"),
    ({"outputs": [{"name": "zzz", "datatype": "BYTES", "dims": [1]}]},
     "m/config.yaml: output 'zzz' is not an output of the model (it has y)"),
])
def test_a_config_yaml_that_contradicts_the_model_is_a_load_error(
        tensors: dict[str, object], named: str) -> None:
    config = ModelConfig.model_validate(tensors)  # config.yaml: no `triton` section
    with pytest.raises(ConfigError) as refused:
        as_declared(Flat(), config, "m/config.yaml")
    assert str(refused.value) == named


def test_a_config_yaml_that_agrees_with_the_model_serves_as_declared() -> None:
    config = ModelConfig.model_validate(
        {"inputs": [{"name": "x", "datatype": "FP32", "dims": [16]}]})
    model = as_declared(Flat(), config, "m/config.yaml")
    assert model.metadata.inputs[0].shape == (-1, 16)
    assert model.infer({"x": np.ones((2, 16), dtype=np.float32)})["y"].shape == (2, 16)


def test_declared_dims_are_served_and_reshaped_both_ways() -> None:
    engine = Flat()
    tensor = {"datatype": "FP32", "dims": [4, 4], "reshape": [16]}
    model = as_declared(engine, _config([{"name": "x", **tensor}], [{"name": "y", **tensor}]),
                        "cfg")
    assert model.metadata.inputs[0].shape == (-1, 4, 4)
    assert model.metadata.outputs[0].shape == (-1, 4, 4)
    out = model.infer({"x": np.ones((3, 4, 4), dtype=np.float32)})
    assert engine.seen == [(3, 16)] and out["y"].shape == (3, 4, 4)


def test_without_a_batch_axis_dims_are_the_whole_shape() -> None:
    engine = Flat(max_batch_size=0)
    model = as_declared(engine, _config([{"name": "x", "datatype": "FP32", "dims": [2, 8],
                                          "reshape": [16]}]), "cfg")
    assert model.metadata.inputs[0].shape == (2, 8)
    model.infer({"x": np.ones((2, 8), dtype=np.float32)})
    assert engine.seen == [(16,)]


@pytest.mark.parametrize(("tensor", "named"), [
    ({"name": "z", "datatype": "FP32", "dims": [16]}, "input 'z' is not an input"),
    ({"name": "x", "datatype": "INT32", "dims": [16]}, "data_type INT32 in the config"),
    ({"name": "x", "datatype": "FP32", "dims": [15]}, "dims [15] do not fit"),
    ({"name": "x", "datatype": "FP32", "dims": [4, 4]}, "dims [4, 4] do not fit"),
    ({"name": "x", "datatype": "FP32", "dims": [-1, -1], "reshape": [16]}, "at most one"),
])
def test_a_config_that_contradicts_the_model_is_a_load_error(tensor: dict[str, object],
                                                             named: str) -> None:
    with pytest.raises(ConfigError, match="cfg: ") as refused:
        as_declared(Flat(), _config([tensor]), "cfg")
    assert named in str(refused.value)


def test_a_request_the_reshape_cannot_take_is_refused_as_input() -> None:
    model = as_declared(Flat(), _config([{"name": "x", "datatype": "FP32", "dims": [-1],
                                          "reshape": [16]}]), "cfg")
    with pytest.raises(EngineRejectedInput, match="reshape"):
        model.infer({"x": np.ones((1, 5), dtype=np.float32)})


def test_fits() -> None:
    assert fits((-1, 16), (-1, 16)) and fits((-1, 3), (-1, -1))
    assert not fits((-1, -1), (-1, 16)) and not fits((16,), (-1, 16))
