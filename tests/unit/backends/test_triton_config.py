"""A Triton Python model's config in Triton's JSON form, from config.yaml, and back to the
metadata Serval serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serval.backends.base import ModelVersionSpec
from serval.backends.triton_config import (
    as_python_model_config,
    initialize_args,
    metadata_from_config,
    triton_model_config,
)
from serval.errors import ConfigError
from serval.model_config import ModelConfig

pytestmark = pytest.mark.unit


def _spec(**config: object) -> ModelVersionSpec:
    return ModelVersionSpec("m", "3", Path("/repo/m/3"), ModelConfig.model_validate(
        {"backend": "python", **config}))


def test_config_yaml_becomes_tritons_json_form() -> None:
    spec = _spec(max_batch_size=8, instances=2, device="cuda:1",
                 batching={"max_queue_delay_ms": 0.5, "preferred_batch_sizes": [4, 8]},
                 version_policy={"all": True},
                 inputs=[{"name": "IN", "datatype": "BYTES", "dims": [-1]}],
                 outputs=[{"name": "OUT", "datatype": "FP16", "dims": [2, 3]}])
    config = triton_model_config(spec)
    assert config["name"] == "m" and config["backend"] == "python"
    assert config["max_batch_size"] == 8
    assert config["input"] == [{"name": "IN", "data_type": "TYPE_STRING", "dims": [-1]}]
    assert config["output"] == [{"name": "OUT", "data_type": "TYPE_FP16", "dims": [2, 3]}]
    assert config["instance_group"] == [{"name": "m", "kind": "KIND_GPU", "count": 2,
                                         "gpus": [1]}]
    assert config["dynamic_batching"] == {"preferred_batch_size": [4, 8],
                                          "max_queue_delay_microseconds": 500}
    assert config["version_policy"] == {"all": {}}
    assert config["model_transaction_policy"] == {"decoupled": False}


def test_an_unbatched_config_has_no_scheduler_and_no_tensors_yet() -> None:
    config = triton_model_config(_spec())
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert config["input"] == [] and config["output"] == []
    assert config["version_policy"] == {"latest": {"num_versions": 1}}


def test_initialize_args_are_strings_as_triton_passes_them() -> None:
    spec = _spec()
    args = initialize_args(spec, {"name": "m"})
    assert args == {"model_config": json.dumps({"name": "m"}), "model_instance_kind": "CPU",
                    "model_instance_name": "m_0_0", "model_instance_device_id": "0",
                    "model_repository": "/repo/m", "model_version": "3", "model_name": "m"}


def test_protobufs_json_form_is_read_with_string_dims() -> None:
    parsed = {"name": "m", "input": [{"name": "A", "data_type": "TYPE_INT64", "dims": ["4"]}],
              "output": [{"name": "B", "data_type": "TYPE_BOOL", "dims": ["-1", "2"]}]}
    config = as_python_model_config(parsed)
    assert config["max_batch_size"] == 0 and config["input"][0]["dims"] == [4]
    assert parsed["input"][0]["dims"] == ["4"]  # a copy
    metadata = metadata_from_config(config, "model 'm'")
    assert metadata.max_batch_size == 0 and metadata.platform == "python"
    assert [(s.name, s.datatype, s.shape) for s in metadata.outputs] == [
        ("B", "BOOL", (-1, 2))]


def test_a_decoupled_policy_makes_a_decoupled_model() -> None:
    config = {"name": "m", "model_transaction_policy": {"decoupled": True},
              "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [1]}],
              "output": [{"name": "B", "data_type": "TYPE_FP32", "dims": [1]}]}
    assert metadata_from_config(as_python_model_config(config), "model 'm'").decoupled
    del config["model_transaction_policy"]
    assert not metadata_from_config(as_python_model_config(config), "model 'm'").decoupled


@pytest.mark.parametrize(("change", "message"), [
    ({"input": []}, "needs its inputs and outputs"),
    ({"max_batch_size": -1}, "max_batch_size must be >= 0"),
    ({"input": [{"name": "A", "data_type": "TYPE_BF16", "dims": [1]}]}, "has data_type"),
    ({"input": [{"name": "A", "data_type": "TYPE_FP32", "dims": ["x"]}]}, "expected integers"),
    ({"input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [0]}]}, "positive sizes"),
    ({"input": [{"data_type": "TYPE_FP32", "dims": [1]}]}, "needs a name"),
])
def test_what_cannot_be_served_is_a_load_error(change: dict[str, object], message: str) -> None:
    config = {"name": "m", "max_batch_size": 4,
              "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [1]}],
              "output": [{"name": "B", "data_type": "TYPE_FP32", "dims": [1]}], **change}
    with pytest.raises(ConfigError, match=message):
        metadata_from_config(as_python_model_config(config), "model 'm'")
