"""A model's validated configuration: config.yaml (and config.pbtxt mapped onto it) as
ModelConfig, with its batching, queue, engine, tensor, warm-up and sequence settings."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serval.errors import ConfigError
from serval.protocol.dtypes import DatatypeName

MODEL_CONFIG_FILE = "config.yaml"
# Bounds of Triton's model_config.proto fields a setting ends up in (get_model_config answers
# in that schema), so every value that validates can be served back.
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
INT64_MAX = 2**63 - 1
MAX_MS = 1e12  # about 31 years: any timeout or idle time in ms, as uint64 microseconds
MAX_THREADS = 1024  # an engine's thread pool: the same bound on every machine (see docs)
# A load's warm-up holds a load slot and the model's lock until it ends: at most this many
# runs of a sample (Triton allows 2**32) and this many elements in one of its inputs (the
# server's default --max-tensor-elements), so no config makes a load that never ends or fills
# the memory (a count of 4,294,967,295 held a slot for hours; batch_size 2**31 allocated it)
MAX_WARMUP_COUNT = 1000
MAX_WARMUP_ELEMENTS = 64 * 1024 * 1024
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~10x faster


class Strict(BaseModel):
    """Settings that refuse unknown fields and never change once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class QueuePolicy(Strict):
    """One queue's rules: its size bound, the timeout of requests that set none, and what a
    request past its timeout gets."""

    max_queue_size: int = Field(
        4096, ge=1, le=UINT32_MAX, description="requests waiting beyond this are refused with 429"
    )
    default_timeout_ms: float = Field(
        0.0, ge=0.0, le=MAX_MS,
        description="a request without a deadline gets this one; 0: none")
    allow_timeout_override: bool = Field(
        True, description="false: default_timeout_ms applies even to requests that set one")
    timeout_action: Literal["reject", "delay"] = Field(
        "reject", description="past its timeout a queued request is refused (504), or with "
        "delay waits behind its level's requests still within theirs")


class BatchingConfig(QueuePolicy):
    """How requests are merged into engine batches (the queue policy: every level's default)."""

    max_queue_delay_ms: float = Field(0.0, ge=0.0, le=10_000.0)
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    priority_levels: int = Field(0, ge=0, le=1000, description="1 (served first) .. N; 0: none")
    default_priority_level: int = Field(1, ge=1, le=1000,
                                        description="for requests that give none")
    priority_queues: dict[int, QueuePolicy] = Field(default_factory=dict)  # by level

    @model_validator(mode="after")
    def _levels_exist(self) -> BatchingConfig:
        levels = self.priority_levels
        if levels and not self.default_priority_level <= levels:
            raise ValueError(f"default_priority_level must be within 1..{levels}")
        if any(not 1 <= level <= levels for level in self.priority_queues):
            raise ValueError(f"priority_queues are keyed by a level within 1..{levels}")
        return self

    @field_validator("preferred_batch_sizes")
    @classmethod
    def _positive_sizes(cls, sizes: list[int]) -> list[int]:
        if any(not 1 <= size <= INT32_MAX for size in sizes):
            raise ValueError(f"preferred batch sizes must be within 1..{INT32_MAX}")
        return sorted(set(sizes))


class VersionPolicy(Strict):
    """Which version folders serve: the `latest` N (default 1), `all`, or `specific` ones."""

    latest: int | None = Field(None, ge=1, le=UINT32_MAX)
    all: bool = False
    specific: list[int] | None = None

    @field_validator("specific")
    @classmethod
    def _version_numbers(cls, versions: list[int] | None) -> list[int] | None:
        if versions is not None and any(not 0 <= v <= INT64_MAX for v in versions):
            raise ValueError(f"specific versions must be within 0..{INT64_MAX}")
        return versions

    @model_validator(mode="after")
    def _one_choice(self) -> VersionPolicy:
        chosen = [self.latest is not None, self.all, self.specific is not None]
        if sum(chosen) > 1:
            raise ValueError("choose one of latest, all, specific")
        return self

    def select(self, versions: tuple[str, ...]) -> tuple[str, ...]:
        """The versions (numeric strings, oldest first) this policy serves."""
        if self.all:
            return versions
        if self.specific is not None:
            wanted = {str(v) for v in self.specific}
            return tuple(v for v in versions if v in wanted)
        return versions[-(self.latest or 1):]


class OnnxRuntimeConfig(Strict):
    """ONNX Runtime session options (None = Serval's core-aware default)."""

    intra_op_threads: int | None = Field(None, ge=1)
    inter_op_threads: int | None = Field(None, ge=1)
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"
    execution_mode: Literal["sequential", "parallel"] = "sequential"
    execution_providers: list[str | tuple[str, dict[str, str]]] | None = Field(
        None, description="names, or [name, {option: value}]; unset: by device")
    memory_arena: bool | None = None  # unset: ONNX Runtime's default (on)
    memory_pattern: bool | None = None  # unset: ONNX Runtime's default (on)
    session_entries: dict[str, str] = Field(default_factory=dict)  # session config keys
    run_entries: dict[str, str] = Field(default_factory=dict)  # run config keys
    allow_spinning: bool | None = Field(
        None, description="unset: on where one batch-1 call takes >= 2 ms (measured at load)")

    @field_validator("intra_op_threads", "inter_op_threads")
    @classmethod
    def _bounded_threads(cls, threads: int | None) -> int | None:
        if threads is not None and threads > MAX_THREADS:
            raise ValueError(f"{threads} threads is more than {MAX_THREADS}, the most Serval "
                             "starts for one model (the same bound on every machine)")
        return threads


class TensorConfig(Strict):
    """A declared input or output: v2 datatype and dims (without the batch axis, as Triton)."""

    name: str = Field(min_length=1)
    datatype: DatatypeName
    dims: list[int] = Field(default_factory=list)
    reshape: list[int] | None = Field(
        None, description="config.pbtxt: the dims the engine sees (clients send dims)")
    optional: bool = Field(False, description="an input requests may leave out (python models)")

    @field_validator("dims")
    @classmethod
    def _valid_dims(cls, dims: list[int]) -> list[int]:
        if any(d == 0 or d < -1 or d > INT64_MAX for d in dims):
            raise ValueError(f"dims are positive sizes up to {INT64_MAX} or -1 (any size)")
        return dims

    @field_validator("reshape")
    @classmethod
    def _valid_reshape(cls, dims: list[int] | None) -> list[int] | None:
        if dims is not None and any(not -1 <= d <= INT64_MAX for d in dims):
            raise ValueError(f"reshape dims are sizes up to {INT64_MAX} or -1 (any size)")
        return dims


class PipelineStep(Strict):
    """One step: a repository model, and how tensor names map into and out of it."""

    model: str = Field(min_length=1)
    version: str | None = None
    inputs: dict[str, str] = Field(description="step input name -> pipeline tensor name")
    outputs: dict[str, str] = Field(description="step output name -> pipeline tensor name")


class WarmupInput(Strict):
    """One input of a warm-up request: its datatype, dims (without the batch axis) and data."""

    datatype: DatatypeName
    dims: list[int] = Field(default_factory=list)
    data: Literal["zero", "random", "file"] = "zero"
    file: str | None = Field(None, description="data: file; a file in the model's warmup/")

    @field_validator("dims")
    @classmethod
    def _fixed_dims(cls, dims: list[int]) -> list[int]:
        if any(not 0 <= d <= INT64_MAX for d in dims):
            raise ValueError(f"warm-up dims are fixed sizes within 0..{INT64_MAX}")
        return dims

    @model_validator(mode="after")
    def _file_with_file_data(self) -> WarmupInput:
        if (self.data == "file") != (self.file is not None):
            raise ValueError("data: file goes with file: NAME (a file in the model's warmup/)")
        return self


class WarmupSample(Strict):
    """A warm-up request run `count` times before the version serves (Triton's model_warmup)."""

    name: str = Field(min_length=1)
    batch_size: int = Field(1, ge=1, le=INT32_MAX)
    count: int = Field(1, ge=1, le=MAX_WARMUP_COUNT)
    inputs: dict[str, WarmupInput]

    @model_validator(mode="after")
    def _bounded(self) -> WarmupSample:
        for name, spec in self.inputs.items():
            elements = self.batch_size * math.prod(spec.dims)
            if elements > MAX_WARMUP_ELEMENTS:
                raise ValueError(f"warm-up '{self.name}' input '{name}' has {elements} elements "
                                 f"(batch_size x dims); at most {MAX_WARMUP_ELEMENTS}")
        return self


class SequenceControl(Strict):
    """A control input the server fills per batch row (Triton's control_input): start, end,
    ready as `false_true` values of `datatype`; corrid as the sequence id (UINT64 or BYTES)."""

    name: str = Field(min_length=1)
    kind: Literal["start", "end", "ready", "corrid"]
    datatype: DatatypeName = "INT32"
    false_true: tuple[float, float] = (0.0, 1.0)


class SequenceState(Strict):
    """Implicit state: the server feeds `input_name` (the initial state on a sequence's start:
    zeros, or `initial_file`'s values) and keeps `output_name` after each step, per sequence."""

    input_name: str = Field(min_length=1)
    output_name: str = Field(min_length=1)
    datatype: DatatypeName
    dims: list[int] = Field(description="fixed sizes, without the batch axis")
    initial_file: str | None = Field(None, description="a file in the model's initial_state/ "
                                     "folder holding the initial state (else zeros)")

    @field_validator("dims")
    @classmethod
    def _fixed_dims(cls, dims: list[int]) -> list[int]:
        if any(not 1 <= d <= INT64_MAX for d in dims):
            raise ValueError(f"state dims are fixed positive sizes up to {INT64_MAX}")
        return dims


class SequenceBatchingConfig(Strict):
    """Stateful models: requests of one sequence (sequence_id) run in order, one row per
    sequence per batch, each sequence holding a slot from its start to its end or idle time."""

    strategy: Literal["direct", "oldest"] = "direct"
    max_sequence_idle_ms: float = Field(1000.0, gt=0.0, le=MAX_MS)
    max_candidate_sequences: int | None = Field(
        None, ge=1, le=INT32_MAX,
        description="oldest: sequences holding state at once; None: the slots")
    max_queue_delay_ms: float = Field(0.0, ge=0.0, le=10_000.0)
    controls: list[SequenceControl] = Field(default_factory=list)
    states: list[SequenceState] = Field(default_factory=list)


class ModelConfig(Strict):
    """What config.yaml beside a model's version directories may say."""

    backend: Literal["onnxruntime", "openvino", "pytorch", "python", "pipeline"] = "onnxruntime"
    max_batch_size: int | None = Field(
        None, ge=0, le=INT32_MAX,
        description="0 disables batching; None: 64 when the model's batch axis is free"
    )
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    sequence_batching: SequenceBatchingConfig | None = Field(
        None, description="stateful models: sequences batched by slot (Triton's)")
    instances: int = Field(1, ge=1, le=64)
    version_policy: VersionPolicy = Field(default_factory=VersionPolicy)
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$")
    onnxruntime: OnnxRuntimeConfig = Field(default_factory=OnnxRuntimeConfig)
    precision: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="pytorch on CUDA: run the model in half or bfloat16 precision"
    )
    inputs: list[TensorConfig] = Field(
        default_factory=list, description="required where the model file does not describe them"
    )
    outputs: list[TensorConfig] = Field(default_factory=list)
    steps: list[PipelineStep] = Field(default_factory=list, description="backend: pipeline")
    isolation: Literal["none", "process"] = Field(
        "none", description="process: the engine runs in a child process, restarted on a crash"
    )
    warmup: list[WarmupSample] = Field(
        default_factory=list, description="requests run once loaded; none: no warm-up (Triton)")
    labels: dict[str, list[str]] = Field(
        default_factory=dict, description="output name -> class labels (label_filename)")
    parameters: dict[str, str] = Field(default_factory=dict,
                                       description="free settings a backend may read")
    file_checksums: dict[str, str] = Field(
        default_factory=dict, description="files of the model folder (relative path) and "
        "their 'md5:<hex>', checked before each load (Triton's checksum repository agent)")
    response_cache: bool = Field(
        False, description="answer repeated requests from the server's response cache "
        "(--cache-config); not for sequence models")
    triton: dict[str, Any] | None = Field(
        None, description="config.pbtxt as Triton's JSON form (set by the repository)")

    @model_validator(mode="after")
    def _warmup_fits_a_batch(self) -> ModelConfig:
        if self.max_batch_size is None:  # known at load (64 or none): the elements bound it
            return self
        largest = max(1, self.max_batch_size)
        for sample in self.warmup:
            if sample.batch_size > largest:
                raise ValueError(f"warm-up '{sample.name}' has batch_size {sample.batch_size}; "
                                 f"the model takes batches of at most {largest} "
                                 "(max_batch_size)")
        return self

    @model_validator(mode="after")
    def _cacheable(self) -> ModelConfig:
        if self.response_cache and self.sequence_batching is not None:
            raise ValueError("response_cache is not supported for sequence models (each "
                             "answer depends on the sequence's state)")
        return self

    @model_validator(mode="after")
    def _optional_inputs(self) -> ModelConfig:
        if any(tensor.optional for tensor in self.outputs):
            raise ValueError("optional is for inputs (a model returns every output)")
        optional = [tensor.name for tensor in self.inputs if tensor.optional]
        if optional and self.backend != "python":
            raise ValueError(f"input '{optional[0]}' is optional: optional inputs are "
                             "supported for python models only")
        return self


def load_model_config(path: Path, override: dict[str, object] | None = None) -> ModelConfig:
    """Read and validate a config.yaml (missing: all defaults), then apply an override."""
    if not path.exists() and not override:
        return ModelConfig()
    raw = _read_yaml(path) if path.exists() else {}
    try:
        return ModelConfig.model_validate({**raw, **(override or {})})
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_first_problem(exc)}") from None


MAX_CONFIG_BYTES = 256 * 1024  # Triton's largest configs (ensembles) hold a few KiB; one is
# parsed on the event loop (a 1 MiB config.pbtxt took seconds there, every request waiting)


def read_config_text(path: Path, max_bytes: int | None = MAX_CONFIG_BYTES) -> str:
    """A model's config (or label) file as text; ConfigError when it is not a readable regular
    file (a folder, a pipe or a device, which would block or never end) of UTF-8 text of at
    most `max_bytes` (None: any size)."""
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; it must be a file")
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise ConfigError(f"{path}: is not a regular file")
            data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or type(exc).__name__}"
                          ) from None
    if max_bytes is not None and len(data) > max_bytes:
        raise ConfigError(f"{path}: is larger than {max_bytes} bytes, the most a model config "
                          "may hold")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
                          f"offset {exc.start})") from None


def _read_yaml(path: Path) -> dict[str, object]:
    text = read_config_text(path)
    try:
        raw = yaml.load(text, Loader=_YAML_LOADER) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a YAML mapping of settings")
    return raw


def _first_problem(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "(top level)"
        problems.append(f"field '{field}': {error['msg']}")
    return "; ".join(problems)
