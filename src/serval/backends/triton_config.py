"""A Triton Python model's configuration in Triton's JSON form (what `args['model_config']`
carries and auto_complete_config edits), and the metadata Serval serves from it."""

from __future__ import annotations

import copy
import json
from typing import Any

from serval.backends.base import ModelMetadata, ModelVersionSpec
from serval.errors import ConfigError
from serval.model_config import TensorConfig, VersionPolicy
from serval.protocol.dtypes import CONFIG_DATATYPES, from_config_type, lookup
from serval.protocol.types import TensorSpec

PLATFORM = "python"


def triton_model_config(spec: ModelVersionSpec) -> dict[str, Any]:
    """The version's configuration as Triton's JSON form of `ModelConfig`, the dict a Triton
    Python model sees: config.pbtxt as it was read when the folder has one, else built from
    Serval's ModelConfig (config.yaml). The rest of the backend only reads this dict."""
    config = spec.config
    if config.triton is not None:
        return as_python_model_config(config.triton)
    max_batch_size = config.max_batch_size or 0
    gpu = config.device.startswith("cuda")
    group: dict[str, Any] = {"name": spec.name, "kind": "KIND_GPU" if gpu else "KIND_CPU",
                             "count": config.instances}
    if gpu:
        group["gpus"] = [int(config.device.partition(":")[2] or 0)]
    result: dict[str, Any] = {
        "name": spec.name,
        "platform": "",
        "backend": "python",
        "version_policy": _version_policy(config.version_policy),
        "max_batch_size": max_batch_size,
        "input": [_tensor(tensor) for tensor in config.inputs],
        "output": [_tensor(tensor) for tensor in config.outputs],
        "instance_group": [group],
        "default_model_filename": "model.py",
        "parameters": {},
        "model_transaction_policy": {"decoupled": False},
    }
    if max_batch_size > 0:
        result["dynamic_batching"] = {
            "preferred_batch_size": list(config.batching.preferred_batch_sizes),
            "max_queue_delay_microseconds": int(config.batching.max_queue_delay_ms * 1000),
        }
    return as_python_model_config(result)


def as_python_model_config(model_config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a config in Triton's JSON form as Triton hands it to a Python model: `input`,
    `output` and `max_batch_size` present, dims as integers (protobuf's JSON mapping writes
    int64 fields such as dims as strings)."""
    result = copy.deepcopy(model_config)
    result.setdefault("max_batch_size", 0)
    for kind in ("input", "output"):
        tensors = result.setdefault(kind, [])
        for tensor in tensors if isinstance(tensors, list) else []:
            if isinstance(tensor, dict) and isinstance(tensor.get("dims"), list):
                tensor["dims"] = [_integer(d) for d in tensor["dims"]]
    return result


def _integer(value: Any) -> Any:
    try:
        return int(value)
    except (TypeError, ValueError):
        return value  # metadata_from_config names the tensor whose dims are wrong


def initialize_args(spec: ModelVersionSpec, model_config: dict[str, Any]) -> dict[str, str]:
    """The `args` Triton passes to initialize(): every value a string, the config as JSON,
    model_repository the model's own folder (as Triton gives it)."""
    device = spec.config.device
    return {
        "model_config": json.dumps(model_config),
        "model_instance_kind": "GPU" if device.startswith("cuda") else "CPU",
        "model_instance_name": f"{spec.name}_0_{spec.instance}",  # group 0, as Triton's
        "model_instance_device_id": device.partition(":")[2] or "0",
        "model_repository": str(spec.path.parent),
        "model_version": spec.version,
        "model_name": spec.name,
    }


def metadata_from_config(model_config: dict[str, Any], where: str) -> ModelMetadata:
    """What Serval serves for a (possibly auto-completed) Triton config: inputs and outputs
    with the batch axis (-1) first when max_batch_size > 0. ConfigError for what Serval
    cannot serve: missing or malformed tensors. model_transaction_policy { decoupled: true }
    makes a decoupled model (0..n responses per request, over gRPC streams)."""
    policy = model_config.get("model_transaction_policy") or {}
    try:
        max_batch_size = int(model_config.get("max_batch_size", 0))
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: max_batch_size must be an integer") from None
    if max_batch_size < 0:
        raise ConfigError(f"{where}: max_batch_size must be >= 0")
    inputs, outputs = model_config.get("input") or [], model_config.get("output") or []
    if not inputs or not outputs:
        raise ConfigError(f"{where}: a Triton Python model needs its inputs and outputs, "
                          "declared in its config or added by auto_complete_config")
    batch = (-1,) if max_batch_size > 0 else ()
    return ModelMetadata(
        PLATFORM,
        tuple(_spec(tensor, batch, where, input=True) for tensor in inputs),
        tuple(_spec(tensor, batch, where) for tensor in outputs),
        max_batch_size,
        decoupled=bool(policy.get("decoupled", False)),
    )


def _spec(tensor: dict[str, Any], batch: tuple[int, ...], where: str,
          input: bool = False) -> TensorSpec:
    name = tensor.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: every input and output needs a name")
    datatype = from_config_type(str(tensor.get("data_type")))
    if datatype is None:
        raise ConfigError(f"{where}: tensor '{name}' has data_type "
                          f"{tensor.get('data_type')!r}; expected one of "
                          f"{', '.join(CONFIG_DATATYPES)}")
    try:
        dims = tuple(int(d) for d in tensor.get("dims", []))
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: tensor '{name}' has dims {tensor.get('dims')!r}, "
                          "expected integers") from None
    if any(d == 0 or d < -1 for d in dims):
        raise ConfigError(f"{where}: tensor '{name}' dims are positive sizes or -1")
    return TensorSpec(name, datatype, (*batch, *dims), input and bool(tensor.get("optional")))


def _tensor(tensor: TensorConfig) -> dict[str, Any]:
    entry = {"name": tensor.name, "data_type": lookup(tensor.datatype).config,
             "dims": list(tensor.dims)}
    return {**entry, "optional": True} if tensor.optional else entry


def _version_policy(policy: VersionPolicy) -> dict[str, Any]:
    if policy.all:
        return {"all": {}}
    if policy.specific is not None:
        return {"specific": {"versions": list(policy.specific)}}
    return {"latest": {"num_versions": policy.latest or 1}}
