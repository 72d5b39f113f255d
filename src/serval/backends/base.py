"""What every backend provides: serve a model version. An engine loads it (describe it, run a
batch) and the registry batches it; a composite (a pipeline) runs other models' steps itself."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from serval.errors import ConfigError, ServalError
from serval.model_config import ModelConfig
from serval.protocol.types import InferRequest, InferResponse, TensorDict, TensorSpec

# A dimension the model file names (ONNX's dim_param, e.g. "sequence") and the (input, axis)
# pairs that carry it: a request must give them one size.
SameDim = tuple[str, tuple[tuple[str, int], ...]]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """What a loaded model accepts and returns; max_batch_size 0 means no batch axis.
    A decoupled model sends 0..n responses per request (see ResponseSink)."""

    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    decoupled: bool = False
    same_dims: tuple[SameDim, ...] = ()  # named free dimensions shared by inputs


@dataclass(frozen=True, slots=True)
class ModelVersionSpec:
    """A model version on disk, as the repository found it."""

    name: str
    version: str
    path: Path
    config: ModelConfig
    instance: int = 0  # which of config.instances, where each has a worker process


class Model(Protocol):
    """A loaded model version as the registry holds it: what it serves, its memory, release."""

    @property
    def metadata(self) -> ModelMetadata: ...

    def memory_bytes(self) -> int: ...

    def unload(self) -> None: ...


class LoadedModel(Model, Protocol):
    """An engine's model ready to run; infer is synchronous, batch-first, and thread safe."""

    def infer(self, inputs: TensorDict) -> TensorDict: ...


@runtime_checkable
class RequestModel(LoadedModel, Protocol):
    """An engine that takes a batch as the list of its requests, unmerged (Triton's
    execute(requests)): each request gets its own outputs, or its own error."""

    def infer_requests(self, requests: Sequence[InferRequest]
                       ) -> list[TensorDict | ServalError]: ...


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """One response of a decoupled model to one request: outputs, or an error, or neither
    (the final flag alone); `final` says the request gets no more."""

    outputs: TensorDict | None = None
    error: ServalError | None = None
    final: bool = False


class ResponseSink(Protocol):
    """Where a decoupled model sends one request's responses, from any thread.

    send() blocks while the client is `window` responses behind (backpressure), and drops
    what is sent once the request is cancelled (returns False). A relay that keeps the
    window itself (a worker process's pipe) uses forward(), which never blocks, and is told
    through relay() when the client takes a response and when the request is cancelled."""

    window: int

    def send(self, response: ModelResponse) -> bool: ...

    def forward(self, response: ModelResponse) -> None: ...

    def relay(self, taken: Callable[[], None], cancelled: Callable[[], None]) -> None: ...

    def is_cancelled(self) -> bool: ...


@dataclass(slots=True)
class StreamRequest(InferRequest):
    """A request to a decoupled model: its responses go to `sink`, not to the batcher (which
    sees execute's return, an empty result, once the model has taken the request)."""

    sink: ResponseSink | None = None


class Runner(Protocol):
    """How requests reach a served model version: a Batcher over an engine's LoadedModel, or
    a pipeline walking its steps. infer is async; deadline_ns is perf_counter_ns; `request`
    is the client's request the inputs come from (its id, parameters, requested outputs)."""

    @property
    def queued(self) -> int: ...

    @property
    def running(self) -> int: ...

    async def infer(self, inputs: TensorDict, deadline_ns: int | None = None,
                    request: InferRequest | None = None) -> TensorDict: ...

    def check_capacity(self, deadline_ns: int | None = None) -> None: ...

    async def drain(self) -> None: ...

    def retire(self) -> None:
        """The version is going (unload, reload, retirement): fail at once what would only
        hold its in-flight count up while it drains (a Sequencer's STARTs waiting for a
        slot); what runs or is queued still completes."""

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Served:
    """A model version once a backend serves it: the model (metadata, memory, release) and
    the runner requests go through."""

    model: Model
    runner: Runner


class ModelCaller(Protocol):
    """Runs one request on another model of the server from an engine's thread (never the
    event loop's), through the data plane's per-model path; its outputs, or a ServalError.
    Waiting stops with ServerUnavailable once `abandon` is set (the caller is unloading)."""

    def __call__(self, model: str, version: str | None, request: InferRequest,
                 timeout_s: float | None, abandon: threading.Event) -> TensorDict: ...

    def stream(self, model: str, version: str | None, request: InferRequest,
               timeout_s: float | None, abandon: threading.Event, cancelled: threading.Event
               ) -> Iterator[tuple[TensorDict | ServalError, bool]]:
        """The model's responses, each with its final flag (a decoupled model's as it sends
        them; another model's one answer); ends early, without a final one, once `cancelled`
        or `abandon` is set."""
        ...


class ServeContext(Protocol):
    """What the registry lends a backend serving one version (see Backend.serve)."""

    async def batch_engine(self, engine: Engine, spec: ModelVersionSpec) -> Served:
        """Load with the engine off the event loop, warm it up, batch its requests."""
        ...

    async def run_step(self, model: str, version: str | None, request: InferRequest,
                       deadline_ns: int | None) -> InferResponse:
        """One inference on another model through the data plane's own per-model path."""
        ...

    def record_step(self, step: str, duration_ns: int) -> None:
        """Count one step's time in the served version's statistics."""
        ...

    def model_caller(self) -> ModelCaller:
        """How this version's engine threads run requests on other models (Triton's BLS)."""
        ...


class Backend(Protocol):
    """Serves the model versions whose config.yaml names it (`backend: <name>`)."""

    name: str

    async def serve(self, spec: ModelVersionSpec, context: ServeContext) -> Served: ...


class Engine(Protocol):
    """Loads model files into a LoadedModel, which the registry batches (backends/engine.py
    makes an engine a Backend)."""

    name: str

    def load(self, spec: ModelVersionSpec) -> LoadedModel: ...


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """What the server tells every backend it builds: its share of the cores, and whether
    model code (the python backend) may run."""

    cores: int
    allow_python_models: bool


DEFAULT_MAX_BATCH_SIZE = 64


def resolve_max_batch_size(configured: int | None, tensors: tuple[TensorSpec, ...],
                           source: str) -> int:
    """The config's max_batch_size, else 64 when every tensor's first axis is free, else 0."""
    batchable = all(spec.shape and spec.shape[0] == -1 for spec in tensors)
    if configured is None:
        return DEFAULT_MAX_BATCH_SIZE if batchable else 0
    if configured > 0 and not batchable:
        raise ConfigError(f"{source}: max_batch_size is {configured} but not every input and "
                          "output has a free first (batch) dimension")
    return configured
