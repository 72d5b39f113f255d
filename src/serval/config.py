"""Validated configuration: per-model config.yaml (ModelConfig) and the server's (ServerConfig)."""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from serval.errors import ConfigError
from serval.protocol.dtypes import DatatypeName

MODEL_CONFIG_FILE = "config.yaml"
MAX_WORKERS = 64
_NODE_NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: ~10x faster


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class QueuePolicy(_Strict):
    """One queue's rules: its size bound, the timeout of requests that set none, and what a
    request past its timeout gets."""

    max_queue_size: int = Field(
        4096, ge=1, description="requests waiting beyond this are refused with 429"
    )
    default_timeout_ms: float = Field(
        0.0, ge=0.0, description="a request without a deadline gets this one; 0: none")
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
    default_priority_level: int = Field(1, ge=1, description="for requests that give none")
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
        if any(size < 1 for size in sizes):
            raise ValueError("preferred batch sizes must be >= 1")
        return sorted(set(sizes))


class VersionPolicy(_Strict):
    """Which version folders serve: the `latest` N (default 1), `all`, or `specific` ones."""

    latest: int | None = Field(None, ge=1)
    all: bool = False
    specific: list[int] | None = None

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


class OnnxRuntimeConfig(_Strict):
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


class TensorConfig(_Strict):
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
        if any(d == 0 or d < -1 for d in dims):
            raise ValueError("dims are positive sizes or -1 (any size)")
        return dims


class PipelineStep(_Strict):
    """One step: a repository model, and how tensor names map into and out of it."""

    model: str = Field(min_length=1)
    version: str | None = None
    inputs: dict[str, str] = Field(description="step input name -> pipeline tensor name")
    outputs: dict[str, str] = Field(description="step output name -> pipeline tensor name")


class WarmupInput(_Strict):
    """One input of a warm-up request: its datatype, dims (without the batch axis) and data."""

    datatype: DatatypeName
    dims: list[int] = Field(default_factory=list)
    data: Literal["zero", "random", "file"] = "zero"
    file: str | None = Field(None, description="data: file; a file in the model's warmup/")

    @model_validator(mode="after")
    def _file_with_file_data(self) -> WarmupInput:
        if (self.data == "file") != (self.file is not None):
            raise ValueError("data: file goes with file: NAME (a file in the model's warmup/)")
        return self


class WarmupSample(_Strict):
    """A warm-up request run `count` times before the version serves (Triton's model_warmup)."""

    name: str = Field(min_length=1)
    batch_size: int = Field(1, ge=1)
    count: int = Field(1, ge=1)
    inputs: dict[str, WarmupInput]


class SequenceControl(_Strict):
    """A control input the server fills per batch row (Triton's control_input): start, end,
    ready as `false_true` values of `datatype`; corrid as the sequence id (UINT64 or BYTES)."""

    name: str = Field(min_length=1)
    kind: Literal["start", "end", "ready", "corrid"]
    datatype: DatatypeName = "INT32"
    false_true: tuple[float, float] = (0.0, 1.0)


class SequenceState(_Strict):
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
        if any(d < 1 for d in dims):
            raise ValueError("state dims are fixed positive sizes")
        return dims


class SequenceBatchingConfig(_Strict):
    """Stateful models: requests of one sequence (sequence_id) run in order, one row per
    sequence per batch, each sequence holding a slot from its start to its end or idle time."""

    strategy: Literal["direct", "oldest"] = "direct"
    max_sequence_idle_ms: float = Field(1000.0, gt=0.0)
    max_candidate_sequences: int | None = Field(
        None, ge=1, description="oldest: sequences holding state at once; None: the slots")
    max_queue_delay_ms: float = Field(0.0, ge=0.0, le=10_000.0)
    controls: list[SequenceControl] = Field(default_factory=list)
    states: list[SequenceState] = Field(default_factory=list)


class ModelConfig(_Strict):
    """What config.yaml beside a model's version directories may say."""

    backend: Literal["onnxruntime", "openvino", "pytorch", "python", "pipeline"] = "onnxruntime"
    max_batch_size: int | None = Field(
        None, ge=0, description="0 disables batching; None: 64 when the model's batch axis is free"
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
    response_cache: bool = Field(
        False, description="answer repeated requests from the server's response cache "
        "(--cache-config); not for sequence models")
    triton: dict[str, Any] | None = Field(
        None, description="config.pbtxt as Triton's JSON form (set by the repository)")

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


MIB = 1024 * 1024


@dataclass(frozen=True)
class TransportLimits:
    """Every transport limit, timeout and budget (serval.server.limits enforces them); each has a
    `serval serve` flag of the same name."""

    # both transports
    max_connections: int = 0  # 0: auto, from the file-descriptor limit
    tls_handshake_timeout_s: float = 10.0
    receive_budget_bytes: int = 192 * MIB
    # HTTP/1.1
    max_request_bytes: int = 64 * MIB  # one body, inflated too (--max-request-mb)
    max_url_bytes: int = 8 * 1024
    max_header_bytes: int = 64 * 1024  # request line and headers together
    max_header_count: int = 100
    header_timeout_s: float = 10.0  # from the first byte of a request to the end of its headers
    body_timeout_s: float = 30.0  # longest pause in a body, or in reading our answers
    keepalive_timeout_s: float = 75.0  # idle between requests
    max_pipelined: int = 32  # requests read ahead of their answers on one connection
    write_buffer_bytes: int = 1 * MIB  # answers queued for a client before reading stops
    # HTTP/2 (gRPC)
    max_message_bytes: int = 64 * MIB  # one gRPC message, received or sent
    h2_max_concurrent_streams: int = 1024
    h2_max_header_list_bytes: int = 64 * 1024
    h2_stream_window_bytes: int = 1 * MIB
    h2_connection_window_bytes: int = 16 * MIB
    h2_max_stream_messages: int = 128  # requests of one stream received and not yet answered
    h2_preface_timeout_s: float = 10.0  # the client's preface and SETTINGS
    h2_idle_timeout_s: float = 300.0  # no open stream this long: GOAWAY
    h2_send_timeout_s: float = 60.0  # answers waiting on a client that takes none: close
    h2_abuse_window_s: float = 10.0
    h2_max_control_frames: int = 1000  # PING, SETTINGS, PRIORITY, empty frames per window
    h2_max_resets: int = 1000  # streams the client reset before their answer, per window

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value < 0 or (value == 0 and name != "max_connections"):
                raise ValueError(f"transport limit {name} must be positive, got {value}")


class ServerConfig(_Strict):
    """The running server's settings, from CLI flags."""

    repository: Path
    host: str = "127.0.0.1"
    http_port: int = Field(8000, ge=0, le=65535)
    grpc_port: int = Field(8001, ge=0, le=65535, description="0 disables gRPC")
    workers: int | Literal["auto"] = Field(
        1, description="serving processes; auto: as many as the cores where every model is "
                       "HTTP-bound, else 1 (server/workers.py resolves it before serving)")
    force_workers: bool = Field(False, description="serve engine-bound models with workers > 1")
    model_control: Literal["all", "lazy", "explicit"] = "all"
    load_models: list[str] = Field(
        default_factory=list, description="explicit control: load these at start (* = all)")
    memory_budget: ByteSize | None = Field(
        None, description="evict least-recently-used idle models beyond this many bytes"
    )
    response_cache_bytes: ByteSize = Field(
        ByteSize(0), description="Triton's response cache (results of models that enable it); "
        "0: none")
    max_concurrent_loads: int = Field(2, ge=1, le=64)
    allow_python_models: bool = Field(False, description="python models run arbitrary code")
    auth_tokens: Path | None = Field(None, description="tokens file: bearer auth when set")
    tls_cert: Path | None = Field(None, description="PEM certificate: HTTPS and gRPC over TLS")
    tls_key: Path | None = None

    @field_validator("workers")
    @classmethod
    def _worker_range(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= MAX_WORKERS:
            raise ValueError(f"workers must be 1 to {MAX_WORKERS} or auto, got {value}")
        return value

    @property
    def worker_count(self) -> int:
        """The resolved number of serving processes (ValueError while still `auto`)."""
        if not isinstance(self.workers, int):
            raise ValueError("workers is still 'auto': resolve it first (server/workers.py)")
        return self.workers

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.load_models and self.model_control != "explicit":
            raise ValueError("--load-model needs --model-control explicit (as Triton's)")
        return self
    max_inflight: int = Field(4096, ge=1, description="requests in the server at once; 429 past")
    default_timeout_ms: float = Field(0.0, ge=0.0, description="0: requests have no deadline")
    metrics_top_k: int = Field(100, ge=1, description="per-model series for the K busiest")
    poll_interval_s: float = Field(0.0, ge=0.0, description="0: never poll the repository")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    trace_file: Path | None = Field(None, description="where sampled requests' traces go")
    trace: dict[str, str | list[str]] = Field(
        default_factory=dict, description="trace settings at start (observability/trace.py)")
    repository_api: bool | None = Field(
        None, description="load/unload over the API; None: on with model control lazy/explicit"
    )
    limits: TransportLimits = Field(default_factory=TransportLimits,
                                    description="per-connection limits, timeouts and budgets")
    max_tensor_elements: int = Field(
        64 * 1024 * 1024, ge=1, description="elements in one input tensor beyond: 400"
    )
    strict_readiness: bool = Field(
        True, description="ready only while every model that should serve is READY (Triton's)")
    shared_memory: bool | None = Field(
        None, description="Triton's system shared memory extension (regions under /dev/shm); "
        "None: on only while the server listens on a loopback address (same-host clients)")
    # behind a load balancer (HAProxy)
    node_name: str | None = Field(
        None, description="the serval-node answer header's value; None: this host's name")
    node_header: bool = Field(True, description="every answer names its node (serval-node)")
    agent_port: int = Field(0, ge=0, le=65535, description="HAProxy agent check; 0: off")
    drain_delay_s: float = Field(
        0.0, ge=0.0, description="on SIGTERM: not ready, still serving, this long; then drain")

    @field_validator("node_name")
    @classmethod
    def _valid_node_name(cls, name: str | None) -> str | None:
        return None if name is None else check_node_name(name)

    @model_validator(mode="after")
    def _agent_port_apart(self) -> ServerConfig:
        if self.agent_port and self.agent_port in (self.http_port, self.grpc_port):
            raise ValueError(f"--agent-port {self.agent_port} is also the HTTP or gRPC port")
        return self

    def resolved_node_name(self) -> str:
        """node_name, else this host's name; ConfigError when the host's name is not a valid
        node name (then --node-name must give one)."""
        if self.node_name is not None:
            return self.node_name
        host = socket.gethostname()
        try:
            return check_node_name(host)
        except ValueError as exc:
            raise ConfigError(f"{exc} (it is this host's name): give one with --node-name"
                              ) from None

    @property
    def repository_api_enabled(self) -> bool:
        """Triton's rule: model control explicit (and lazy) enable load/unload, else a flag."""
        if self.repository_api is not None:
            return self.repository_api
        return self.model_control != "all"


def check_node_name(name: str) -> str:
    """A node name as HAProxy and the serval-node header take it; ValueError otherwise."""
    if not _NODE_NAME.fullmatch(name):
        raise ValueError(f"node name {name[:80]!r} must be 1 to 64 characters of "
                         "A-Z a-z 0-9 . _ : -")
    return name


def server_default(name: str) -> Any:
    """The default of one ServerConfig setting: flags, the cluster's config and the classes
    the server builds read it here, so each default is written once."""
    return ServerConfig.model_fields[name].default


def load_model_config(path: Path, override: dict[str, object] | None = None) -> ModelConfig:
    """Read and validate a config.yaml (missing: all defaults), then apply an override."""
    if not path.exists() and not override:
        return ModelConfig()
    raw = _read_yaml(path) if path.exists() else {}
    try:
        return ModelConfig.model_validate({**raw, **(override or {})})
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_first_problem(exc)}") from None


def _read_yaml(path: Path) -> dict[str, object]:
    try:
        raw = yaml.load(path.read_text(), Loader=_YAML_LOADER) or {}
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
