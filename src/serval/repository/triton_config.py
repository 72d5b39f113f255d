"""config.pbtxt: Triton's model configuration, read with protobuf's text format against the
vendored model_config.proto and mapped onto Serval's ModelConfig (pure functions).

Precedence: a model folder holding both config.pbtxt and config.yaml is configured by
config.pbtxt alone; config.yaml is then ignored, with a warning naming both files.

What maps where: platform/backend -> backend (onnxruntime_onnx, pytorch_libtorch, python,
openvino; ensemble -> a pipeline whose steps are ensemble_scheduling.step); max_batch_size as is
(0: no batch axis, dims are the whole shape); input/output -> inputs/outputs (datatype, dims,
reshape, an input's optional: python models; checked against the model file and served as
declared: repository/declared.py);
sequence_batching -> sequence_batching (repository/triton_sequence.py);
dynamic_batching -> batching (preferred_batch_size, max_queue_delay_microseconds, priority
levels; preserve_ordering holds already: each request has its own answer, and a stream's
answers of a model that is not decoupled go out in request order;
default_queue_policy: max_queue_size, default_timeout_microseconds, allow_timeout_override,
timeout_action); instance_group counts -> instances (one engine session/thread each;
KIND_GPU -> device cuda[:N]; a rate_limiter is not applied, as Triton without --rate-limit);
version_policy; model_warmup (zero_data, random_data, input_data_file) -> warmup;
parameters -> parameters (string values); label_filename -> labels;
model_transaction_policy.decoupled: the python backend's decoupled models (others refuse it);
response_cache.enable -> response_cache (not with decoupled or sequence models); an ONNX
model's optimization and ONNX Runtime parameters -> onnxruntime (repository/triton_onnxruntime.py).
Any other field set, or a value Serval cannot honour, is a load error naming the field.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from pydantic import ValidationError

from serval.errors import ConfigError
from serval.model_config import ModelConfig, read_config_text
from serval.protocol.dtypes import from_config_type
from serval.protocol.grpc import model_config_pb2 as mc
from serval.repository.checksums import checksum_settings
from serval.repository.declared import SELF_DESCRIBING
from serval.repository.triton_onnxruntime import OPTIMIZATION_SUPPORTED, onnxruntime_settings
from serval.repository.triton_sequence import SEQUENCE_SUPPORTED, sequence_settings

log = logging.getLogger(__name__)

PBTXT_FILE = "config.pbtxt"
_WARNED_BOTH: set[Path] = set()  # model folders whose config.yaml was reported ignored
_MAX_WARNED = 1024  # each load from files has a folder of its own: forget, never grow for ever
# Triton's platform and backend names -> (Serval's backend, Triton's platform, Triton's backend)
_PLATFORMS = {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch",
              "ensemble": "pipeline"}
_BACKENDS = {"onnxruntime": "onnxruntime", "pytorch": "pytorch", "python": "python",
             "openvino": "openvino"}
_TRITON_NAMES = {"onnxruntime": ("onnxruntime_onnx", "onnxruntime"),
                 "pytorch": ("pytorch_libtorch", "pytorch"), "python": ("", "python"),
                 "openvino": ("", "openvino"), "pipeline": ("ensemble", "")}
_MODEL_FILES = {"onnxruntime": ("model.onnx",), "pytorch": ("model.pt", "model.pt2"),
                "python": ("model.py",), "openvino": ("model.xml", "model.onnx")}
_TENSOR = {"name": None, "data_type": None, "dims": None, "format": None,
           "reshape": {"shape": None}}
_QUEUE_POLICY = {"timeout_action": None, "default_timeout_microseconds": None,
                 "allow_timeout_override": None, "max_queue_size": None}
# The fields Serval honours, nested as the schema nests them (None: a leaf).
SUPPORTED: dict[str, Any] = {
    "name": None, "platform": None, "backend": None, "max_batch_size": None,
    "default_model_filename": None,
    "input": {**_TENSOR, "optional": None},
    "output": {**_TENSOR, "label_filename": None},
    "version_policy": {"latest": {"num_versions": None}, "all": {},
                       "specific": {"versions": None}},
    "dynamic_batching": {
        "preferred_batch_size": None, "max_queue_delay_microseconds": None,
        "default_queue_policy": _QUEUE_POLICY, "priority_levels": None, "preserve_ordering": None,
        "default_priority_level": None, "priority_queue_policy": _QUEUE_POLICY},
    "instance_group": {"name": None, "kind": None, "count": None, "gpus": None,
                       "rate_limiter": {"resources": {"name": None, "global": None,
                                                      "count": None}, "priority": None}},
    "model_warmup": {"name": None, "batch_size": None, "count": None,
                     "inputs": {"data_type": None, "dims": None, "zero_data": None,
                                "random_data": None, "input_data_file": None}},
    "sequence_batching": SEQUENCE_SUPPORTED,
    "parameters": {"string_value": None},
    "model_transaction_policy": {"decoupled": None},
    "response_cache": {"enable": None},
    "optimization": OPTIMIZATION_SUPPORTED,
    "ensemble_scheduling": {"step": {"model_name": None, "model_version": None,
                                     "input_map": None, "output_map": None}},
    "model_repository_agents": {"agents": {"name": None, "parameters": None}},
}


def read_pbtxt(path: Path) -> mc.ModelConfig:
    """Parse a config.pbtxt; a syntax error or a field the schema lacks is a ConfigError."""
    text = read_config_text(path)
    try:
        parsed: mc.ModelConfig = text_format.Parse(text, mc.ModelConfig())
        return parsed
    except text_format.ParseError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def parse_json(value: dict[str, Any], source: str) -> mc.ModelConfig:
    """A config in Triton's JSON form (what get_model_config answers and load_model's `config`
    sends); a field the schema lacks is a ConfigError naming it."""
    try:
        parsed: mc.ModelConfig = json_format.ParseDict(value, mc.ModelConfig())
        return parsed
    except json_format.ParseError as exc:
        raise ConfigError(f"{source}: {exc}") from None


def load_pbtxt(model_dir: Path, override: dict[str, object] | None = None) -> ModelConfig:
    """A model folder's config.pbtxt as Serval's ModelConfig (config.yaml beside it ignored,
    with a warning once per folder)."""
    path = model_dir / PBTXT_FILE
    if (model_dir / "config.yaml").exists() and model_dir not in _WARNED_BOTH:
        if len(_WARNED_BOTH) >= _MAX_WARNED:
            _WARNED_BOTH.clear()  # at worst a folder is reported twice
        _WARNED_BOTH.add(model_dir)
        log.warning("both config files present: %s is used, %s is ignored",
                    path, model_dir / "config.yaml", extra={"model": model_dir.name})
    return to_model_config(read_pbtxt(path), model_dir, str(path), override)


def to_model_config(config: mc.ModelConfig, model_dir: Path, source: str,
                    override: dict[str, object] | None = None) -> ModelConfig:
    """Map a parsed config onto ModelConfig; ConfigError naming any field Serval does not
    honour. `override` is config.yaml settings laid over the result."""
    backend = check_fields(config, model_dir.name, source)
    settings: dict[str, Any] = {
        "backend": backend,
        "max_batch_size": config.max_batch_size,
        "inputs": [_tensor(t, f"input '{t.name}'", source) for t in config.input],
        "outputs": [_tensor(t, f"output '{t.name}'", source) for t in config.output],
        "version_policy": _version_policy(config),
        "parameters": {key: value.string_value for key, value in config.parameters.items()},
        "labels": {t.name: _labels(model_dir, t.label_filename, source)
                   for t in config.output if t.label_filename},
        "warmup": [_warmup(sample, source) for sample in config.model_warmup],
        "steps": [_step(step) for step in config.ensemble_scheduling.step],
        "response_cache": config.response_cache.enable,
        **_instances(config, source),
        **checksum_settings(config, source),
    }
    if config.HasField("dynamic_batching"):
        settings["batching"] = _batching(config.dynamic_batching, source)
    if config.HasField("sequence_batching"):
        settings["sequence_batching"] = sequence_settings(config.sequence_batching, source)
    if backend == "onnxruntime":
        settings["onnxruntime"] = onnxruntime_settings(config, settings.get("device", "cpu"),
                                                       source)
    settings["triton"] = triton_json(complete(config, model_dir.name, backend))
    try:
        return ModelConfig.model_validate({**settings, **(override or {})})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise ConfigError(f"{source}: setting '{where}': {error['msg']}") from None


def check_fields(config: mc.ModelConfig, name: str, source: str) -> str:
    """Serval's backend for the config; ConfigError naming a field it cannot honour."""
    check_supported(config, SUPPORTED, source)
    if config.name and config.name != name:
        raise ConfigError(f"{source}: field 'name' is '{config.name}' but the model's folder "
                          f"is '{name}'")
    backend = serval_backend(config, source)
    model_files = _MODEL_FILES.get(backend, ())
    if config.default_model_filename and config.default_model_filename not in model_files:
        raise ConfigError(f"{source}: field 'default_model_filename' "
                          f"'{config.default_model_filename}' is not supported (Serval loads "
                          f"{' or '.join(model_files) or 'no file'} for this backend)")
    if config.model_transaction_policy.decoupled and (backend != "python"
                                                       or config.model_warmup):
        raise ConfigError(f"{source}: field 'model_transaction_policy.decoupled' is supported "
                          "for python models without model_warmup only")
    if config.model_transaction_policy.decoupled and config.dynamic_batching.preserve_ordering:
        raise ConfigError(f"{source}: field 'dynamic_batching.preserve_ordering' is not "
                          "supported for decoupled models (their responses go out as sent)")
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise ConfigError(f"{source}: field 'response_cache' is not supported for decoupled "
                          "models (a request may have many responses)")
    if config.HasField("optimization") and backend != "onnxruntime":
        raise ConfigError(f"{source}: field 'optimization' is supported for ONNX Runtime "
                          "models only")
    if backend not in SELF_DESCRIBING and any(
            t.HasField("reshape") for t in [*config.input, *config.output]):
        raise ConfigError(f"{source}: field 'reshape' is supported for "
                          f"{' and '.join(SELF_DESCRIBING)} models only")
    return backend


def check_supported(message: Message, supported: dict[str, Any], source: str,
                    path: str = "") -> None:
    """ConfigError naming the first field set in `message` that `supported` does not list."""
    for field, value in message.ListFields():
        where = f"{path}{field.name}"
        if field.name not in supported:
            raise ConfigError(f"{source}: field '{where}' is not supported by Serval")
        nested = supported[field.name]
        if nested is None or field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if field.message_type.GetOptions().map_entry:
            items = [v for v in value.values() if isinstance(v, Message)]
        elif field.is_repeated:
            items = list(value)
        else:
            items = [value]
        for item in items:
            check_supported(item, nested, source, f"{where}.")


def serval_backend(config: mc.ModelConfig, source: str) -> str:
    """Serval's backend for Triton's platform and/or backend (they must agree)."""
    by_platform = _PLATFORMS.get(config.platform) if config.platform else None
    by_backend = _BACKENDS.get(config.backend) if config.backend else None
    if config.platform and by_platform is None:
        raise ConfigError(f"{source}: field 'platform' '{config.platform}' is not supported by "
                          f"Serval (it serves {', '.join(sorted(_PLATFORMS))})")
    if config.backend and by_backend is None:
        raise ConfigError(f"{source}: field 'backend' '{config.backend}' is not supported by "
                          f"Serval (it serves {', '.join(sorted(_BACKENDS))})")
    if by_platform and by_backend and by_platform != by_backend:
        raise ConfigError(f"{source}: platform '{config.platform}' and backend "
                          f"'{config.backend}' disagree")
    return by_platform or by_backend or "onnxruntime"


def _datatype(value: int, where: str, source: str) -> str:
    config_name = mc.DataType.Name(value)
    datatype = from_config_type(config_name)
    if datatype is None:
        raise ConfigError(f"{source}: {where}: data_type {config_name} is not supported by "
                          "Serval")
    return datatype


def _tensor(tensor: mc.ModelInput | mc.ModelOutput, where: str, source: str
            ) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": tensor.name, "datatype": _datatype(tensor.data_type, where, source),
        "dims": list(tensor.dims),
        "reshape": list(tensor.reshape.shape) if tensor.HasField("reshape") else None}
    if isinstance(tensor, mc.ModelInput) and tensor.optional:
        entry["optional"] = True
    return entry


def _version_policy(config: mc.ModelConfig) -> dict[str, Any]:
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return {"all": True}
    if choice == "specific":
        return {"specific": list(policy.specific.versions)}
    if choice == "latest":
        return {"latest": max(1, policy.latest.num_versions)}
    return {}


def _labels(model_dir: Path, filename: str, source: str) -> list[str]:
    path = (model_dir / filename).resolve()
    if model_dir.resolve() not in path.parents or not path.exists():
        raise ConfigError(f"{source}: label_filename '{filename}': no such file in the model's "
                          "folder")
    return [line.strip() for line in read_config_text(path, None).splitlines()]


def _warmup(sample: mc.ModelWarmup, source: str) -> dict[str, Any]:
    inputs = {}
    for name, spec in sample.inputs.items():
        where = f"model_warmup '{sample.name}' input '{name}'"
        data = spec.WhichOneof("input_data_type")
        if data is None:
            raise ConfigError(f"{source}: {where}: give zero_data, random_data or "
                              "input_data_file")
        inputs[name] = {"datatype": _datatype(spec.data_type, where, source),
                        "dims": list(spec.dims), "data": data.removesuffix("_data")}
        if data == "input_data_file":
            inputs[name].update(data="file", file=spec.input_data_file)
    return {"name": sample.name or "warmup", "batch_size": max(1, sample.batch_size),
            "count": max(1, sample.count), "inputs": inputs}


def _step(step: mc.ModelEnsembling.Step) -> dict[str, Any]:
    return {"model": step.model_name,
            "version": str(step.model_version) if step.model_version > 0 else None,
            "inputs": dict(step.input_map), "outputs": dict(step.output_map)}


def _instances(config: mc.ModelConfig, source: str) -> dict[str, Any]:
    """Every group's count summed into Serval's instances; all groups of one device."""
    if not config.instance_group:
        return {}
    devices = set()
    if any(group.HasField("rate_limiter") for group in config.instance_group):
        log.warning("%s: instance_group.rate_limiter is not applied: Serval runs as Triton "
                    "does without --rate-limit (each instance runs when it is free)", source)
    for group in config.instance_group:
        if group.kind == mc.ModelInstanceGroup.KIND_GPU:
            if len(group.gpus) > 1:
                raise ConfigError(f"{source}: field 'instance_group.gpus': Serval runs a model "
                                  "on one GPU")
            devices.add(f"cuda:{group.gpus[0]}" if group.gpus else "cuda")
        elif group.kind == mc.ModelInstanceGroup.KIND_MODEL:
            raise ConfigError(f"{source}: field 'instance_group.kind' KIND_MODEL is not "
                              "supported by Serval")
        else:
            devices.add("cpu")
    if len(devices) > 1:
        raise ConfigError(f"{source}: field 'instance_group': Serval runs all of a model's "
                          f"instances on one device, not {sorted(devices)}")
    count = sum(max(1, group.count) for group in config.instance_group)
    return {"instances": count, "device": devices.pop()}


def _batching(batching: mc.ModelDynamicBatching, source: str) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "preferred_batch_sizes": list(batching.preferred_batch_size),
        "max_queue_delay_ms": batching.max_queue_delay_microseconds / 1000,
        **_queue_policy(batching.default_queue_policy),
    }
    if not batching.HasField("default_queue_policy"):
        del settings["allow_timeout_override"]  # Serval's default: a request's own holds
    if batching.priority_levels:
        settings["priority_levels"] = batching.priority_levels
        settings["default_priority_level"] = batching.default_priority_level
        if not 1 <= batching.default_priority_level <= batching.priority_levels:
            raise ConfigError(f"{source}: field 'dynamic_batching.default_priority_level' "
                              f"must be within 1..{batching.priority_levels} (the "
                              "priority_levels)")
        settings["priority_queues"] = {
            level: _queue_policy(policy)
            for level, policy in batching.priority_queue_policy.items()}
    elif batching.priority_queue_policy:
        raise ConfigError(f"{source}: field 'dynamic_batching.priority_queue_policy' needs "
                          "priority_levels")
    return settings


def _queue_policy(queue: mc.ModelQueuePolicy) -> dict[str, Any]:
    """A queue policy as QueuePolicy settings (a max_queue_size of 0, Triton's "no bound",
    leaves Serval's default bound)."""
    settings: dict[str, Any] = {"default_timeout_ms": queue.default_timeout_microseconds / 1000,
                                "allow_timeout_override": queue.allow_timeout_override,
                                "timeout_action": "delay" if queue.timeout_action
                                == mc.ModelQueuePolicy.DELAY else "reject"}
    if queue.max_queue_size > 0:
        settings["max_queue_size"] = queue.max_queue_size
    return settings


def complete(config: mc.ModelConfig, name: str, backend: str) -> mc.ModelConfig:
    """The config as Triton reports it: name, platform and backend, version policy filled."""
    done = mc.ModelConfig()
    done.CopyFrom(config)
    done.name = name
    platform, triton_backend = _TRITON_NAMES[backend]
    done.platform = done.platform or platform
    done.backend = done.backend or triton_backend
    if not done.HasField("version_policy"):
        done.version_policy.latest.num_versions = 1
    return done


def triton_json(config: Message) -> dict[str, Any]:
    """Triton's JSON form of a config: proto field names, every field, integers as numbers."""
    raw = json_format.MessageToDict(config, preserving_proto_field_name=True,
                                    always_print_fields_with_no_presence=True)
    return _numbers(config.DESCRIPTOR, raw)


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def _numbers(descriptor: Descriptor, raw: dict[str, Any]) -> dict[str, Any]:
    """json_format writes 64-bit integers as strings; Triton writes numbers."""
    for field in descriptor.fields:
        if field.name not in raw:
            continue
        value = raw[field.name]
        if field.type in _INT64:
            raw[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                if value_field.type in _INT64:
                    raw[field.name] = {k: int(v) for k, v in value.items()}
                elif value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    for item in value.values():
                        _numbers(value_field.message_type, item)
            else:
                for item in value if isinstance(value, list) else [value]:
                    _numbers(field.message_type, item)
    return raw
