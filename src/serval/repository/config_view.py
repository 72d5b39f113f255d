"""A model's configuration as Triton's model_configuration extension shows it: config.pbtxt as
it was read (its tensors filled in from the loaded model where it leaves them out), else one
built from config.yaml and the loaded model's metadata in Triton's field names."""

from __future__ import annotations

from typing import Any

from serval.backends.base import ModelMetadata
from serval.model_config import ModelConfig
from serval.protocol.dtypes import lookup
from serval.protocol.types import TensorSpec
from serval.repository.triton_sequence import triton_sequence_batching


def triton_model_config(name: str, config: ModelConfig | None,
                        metadata: ModelMetadata) -> dict[str, Any]:
    """The configuration of model `name`, loaded with `config` and answering `metadata`."""
    batch_dims = 1 if metadata.max_batch_size > 0 else 0
    if config is not None and config.triton is not None:  # config.pbtxt, as it was read
        return {**config.triton,
                "input": config.triton.get("input") or [
                    _config_tensor(spec, batch_dims) for spec in metadata.inputs],
                "output": config.triton.get("output") or [
                    _config_tensor(spec, batch_dims) for spec in metadata.outputs]}
    return {
        "name": name,
        "platform": metadata.platform,
        "backend": config.backend if config else "",
        "max_batch_size": metadata.max_batch_size,
        "input": [_config_tensor(spec, batch_dims) for spec in metadata.inputs],
        "output": [_config_tensor(spec, batch_dims) for spec in metadata.outputs],
        **_scheduling(config),
        "instance_group": [{"count": config.instances if config else 1, "kind": "KIND_CPU"}],
    }


def _scheduling(config: ModelConfig | None) -> dict[str, Any]:
    """How the model's requests are scheduled, in Triton's words: its sequence batcher, or
    the dynamic batcher's delay."""
    if config is not None and config.sequence_batching is not None:
        return {"sequence_batching": triton_sequence_batching(config.sequence_batching)}
    delay_ms = config.batching.max_queue_delay_ms if config else 0.0
    return {"dynamic_batching": {"max_queue_delay_microseconds": int(delay_ms * 1000)}}


def _config_tensor(spec: TensorSpec, batch_dims: int) -> dict[str, Any]:
    return {"name": spec.name, "data_type": lookup(spec.datatype).config,
            "dims": list(spec.shape[batch_dims:])}
