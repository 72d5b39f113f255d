"""The one API both transports call: validate, route to a model's runner, account, answer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from serval import __version__
from serval.auth import current_token
from serval.backends.base import ModelMetadata
from serval.backends.validation import validate_request
from serval.config import server_default
from serval.errors import (
    DecoupledUnary,
    InvalidInput,
    LoadFailed,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    PermissionDenied,
    ServalError,
    UnsupportedCall,
    shown,
)
from serval.loop_share import LoopShare
from serval.observability.log_settings import LogControl
from serval.observability.trace import Tracer, Value
from serval.protocol.classification import classify
from serval.protocol.deadlines import request_deadline
from serval.protocol.rest_codec import json_object
from serval.protocol.shared_memory import SharedMemoryRegistry
from serval.protocol.shm_tensors import resolve_inputs, write_outputs
from serval.protocol.types import InferRequest, InferResponse, TensorDict
from serval.repository.config_view import triton_model_config
from serval.repository.names import check_requested_name, not_ready_message
from serval.repository.overrides import MAX_FILES_BYTES, prepare_override
from serval.repository.registry import ModelRegistry
from serval.repository.response_cache import Lookup, look_up
from serval.repository.served import ModelState, ServedModel

log = logging.getLogger(__name__)

SERVER_NAME = "serval"
EXTENSIONS = ("binary_tensor_data", "classification", "sequence", "statistics",
              "model_configuration", "model_repository", "model_repository(unload_dependents)",
              "parameters", "logging", "trace")


class DataPlane:
    """Inference, metadata, readiness and statistics over the registry's models."""

    def __init__(self, registry: ModelRegistry, *,
                 max_inflight: int = server_default("max_inflight"),
                 default_timeout_ms: float = server_default("default_timeout_ms"),
                 repository_api: bool = False,
                 max_tensor_elements: int = server_default("max_tensor_elements"),
                 strict_readiness: bool = server_default("strict_readiness"),
                 shared_memory: SharedMemoryRegistry | None = None,
                 logs: LogControl | None = None, tracer: Tracer | None = None) -> None:
        self.registry = registry
        self.loop_share = LoopShare()  # for work over every model (statistics, index, status)
        self.logs = logs  # the logging extension; None: this process's logging is not ours
        self.tracer = tracer or Tracer()
        self.shared_memory = shared_memory  # system shm regions; None: the extension is off
        self.strict_readiness = strict_readiness
        self.max_inflight = max_inflight
        self.repository_api = repository_api  # load/unload allowed (both transports ask here)
        self.max_tensor_elements = max_tensor_elements
        self.default_timeout_ns = int(default_timeout_ms * 1_000_000)
        self.max_override_bytes = MAX_FILES_BYTES  # a load's files (the server's request limit)
        self._inflight = 0
        self.inflight_refusals = 0  # 429s for --max-inflight, server-wide (/metrics)
        self._ready = False
        self._asked: set[str] = set()  # loaded through the API (explicit: they should serve)
        self._unloaded: set[str] = set()  # unloaded through the API (all: they need not)
        registry.route_steps(self._infer_model)  # a pipeline's steps take the same path

    def set_ready(self, ready: bool) -> None:
        self._ready = ready

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return not self.not_ready_reason()

    def not_ready_reason(self) -> str:
        """"" when ready; else why not, without model names (health probes are open).

        Ready means started and not draining and, with strict readiness (Triton's
        --strict-readiness, the default), every model that should serve is READY: under model
        control `all` every model of the repository (but those unloaded through the API),
        under `explicit` every model loaded through the API and not unloaded since. Under
        `lazy` no model holds the server's readiness: each loads on its first request, and a
        model that fails to load fails its own requests, never the node's health check (a
        cluster node would otherwise leave the rotation over one bad model)."""
        if not self._ready:
            return "not ready: the server is starting or shutting down"
        if not self.strict_readiness:
            return ""
        problems = self.registry.not_serving(self._should_serve())
        if not problems:
            return ""
        for problem in problems:
            log.debug("not ready", extra={"reason": problem})
        return (f"not ready: {len(problems)} model version(s) that should serve do not (the "
                "repository index says why; --no-strict-readiness ignores models)")

    def _should_serve(self) -> list[str]:
        control = self.registry.control
        if control == "all":
            return [name for name in self.registry.model_names() if name not in self._unloaded]
        return sorted(self._asked) if control == "explicit" else []

    @property
    def inflight(self) -> int:
        """Requests admitted and not yet answered (--max-inflight bounds them)."""
        return self._inflight

    def server_metadata(self) -> dict[str, Any]:
        shm = ("system_shared_memory",) if self.shared_memory is not None else ()
        return {"name": SERVER_NAME, "version": __version__,
                "extensions": [*EXTENSIONS, *shm]}

    def log_settings(self, changes: Mapping[str, object] | None = None) -> dict[str, Any]:
        """The logging extension: the settings, after `changes` if given."""
        if self.logs is None:
            raise UnsupportedCall("this server's logging is configured by its host process")
        return self.logs.update(changes) if changes is not None else self.logs.get()

    def trace_settings(self, model: str | None, changes: Mapping[str, Any] | None = None
                       ) -> dict[str, Value]:
        """The trace extension: global or one model's settings, after `changes` if given."""
        if model:
            self.registry.get(model)  # ModelNotFound (404) for a model the server doesn't have
        model = model or None
        return self.tracer.update(model, changes) if changes is not None else \
            self.tracer.settings(model)

    async def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        async with self.registry.acquire(name, version) as served:
            metadata = require_metadata(served)
        return {
            "name": name,
            "versions": self.registry.ready_versions(name),
            "platform": metadata.platform,
            "inputs": [spec.as_dict() for spec in metadata.inputs],
            "outputs": [spec.as_dict() for spec in metadata.outputs],
        }

    def model_ready(self, name: str, version: str | None = None) -> bool:
        """Whether the model (version) serves now; false, not an error, for one the server does
        not know (as Triton). A pipeline is ready only while every step's model is."""
        try:
            served = self.registry.get(name, version)
        except (ModelNotFound, InvalidInput):  # a version string that is no number too
            return False
        return served.state is ModelState.READY and not self.registry.unready_steps(served)

    async def model_config(self, name: str, version: str | None = None) -> dict[str, Any]:
        """The model's configuration as Triton's model_configuration extension shows it."""
        async with self.registry.acquire(name, version) as served:
            metadata = require_metadata(served)
        return triton_model_config(name, served.spec.config if served.spec else None,
                                   metadata)

    def repository_index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model version with its state and reason (Triton's repository index)."""
        index = self.registry.index()
        return [entry for entry in index if entry["state"] == "READY"] if ready_only else index

    async def load_model(self, name: str, config_override: str | dict[str, Any] | None = None,
                         files: Mapping[str, bytes] | None = None) -> None:
        """(Re)load a model, with an override while one is given: `config` (Triton's JSON form
        or config.yaml settings; an object or JSON text) and `files` ('file:<path>' -> bytes,
        a config required with them: they replace the model's folder, new models included)."""
        self._require_repository_api("load")
        check_requested_name(name)
        override = await asyncio.to_thread(prepare_override, name,
                                           _config_override(config_override), files or {},
                                           self.max_override_bytes)
        try:
            await self.registry.load(name, override)
        except (ModelNotReady, LoadFailed):  # asked all the same: it should serve (as Triton)
            if self.registry.versions_of(name):  # not a new name whose files failed: kept none
                self.mark_asked(name)
            raise
        self.mark_asked(name)

    def mark_asked(self, name: str) -> None:
        """The model should serve (explicit control: loaded through the API or at start)."""
        self._asked.add(name)
        self._unloaded.discard(name)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Unload a model; `unload_dependents` (Triton's): a pipeline's step models too."""
        self._require_repository_api("unload")
        steps = self.registry.step_models(name) if unload_dependents else []
        for model in [name, *steps]:
            if model != name and model not in self.registry.model_names():
                continue  # a step model the repository no longer has: nothing to unload
            await self.registry.unload(model)
            self._asked.discard(model)
            self._unloaded.add(model)

    def _require_repository_api(self, action: str) -> None:
        if not self.repository_api:
            raise PermissionDenied(
                f"model {action} through the repository API is disabled on this server; "
                "start it with --model-control explicit (or lazy), or with --repository-api"
            )

    def statistics(self, name: str | None = None, version: str | None = None) -> dict[str, Any]:
        """Triton's statistics extension: every model, or one model (all or one version)."""
        if not name:
            models = self.registry.all_models()
        elif version:
            models = [self.registry.get(name, version)]
        else:
            models = [self.registry.get(name, v) for v in self.registry.versions_of(name)]
            if not models:  # as Triton: an error, not an empty list
                raise ModelNotFound(f"requested model {shown(name)} is not available")
        return {"model_stats": [served.stats.as_triton_dict() for served in models]}

    async def infer(
        self, name: str, version: str | None, request: InferRequest, received_ns: int,
        deadline_ns: int | None = None,
    ) -> InferResponse:
        """Admit a client's request (429 past max_inflight), give it its deadline, run it.

        The deadline is the earliest of the transport's (gRPC, Serval-Timeout-Ms) and the
        request's `parameters.timeout` (µs, as Triton; 0 = none); the server default applies
        to requests that set neither. A request still queued then is dropped before compute
        (504).
        """
        deadline_ns = self._enter(request, received_ns, deadline_ns)
        if self.tracer.active:
            request.trace = self.tracer.start(name, received_ns)
        try:  # (no context manager here: this is every request's path)
            response = await self._infer_model(name, version, request, received_ns,
                                               deadline_ns)
        finally:
            self._inflight -= 1
            if request.trace is not None:
                self.tracer.finish(request.trace, time.perf_counter_ns())
        if request.outputs:  # outputs asked for in shared memory are written there
            write_outputs(self.shared_memory, request, response, current_token())
        return response

    @contextlib.contextmanager
    def in_flight(self, request: InferRequest, received_ns: int,
                  deadline_ns: int | None) -> Iterator[int | None]:
        """Count a client's request in flight while it runs (429 past max_inflight; its sizes
        checked, its shared-memory inputs read); yields its deadline (see infer)."""
        deadline_ns = self._enter(request, received_ns, deadline_ns)
        try:
            yield deadline_ns
        finally:
            self._inflight -= 1

    def _enter(self, request: InferRequest, received_ns: int,
               deadline_ns: int | None) -> int | None:
        """Admit a request in flight (the caller counts it out); its deadline."""
        self._check_inflight()
        if request.shared_memory_inputs or request.outputs:
            resolve_inputs(self.shared_memory, request, self.max_tensor_elements,
                           current_token())  # from shm, the regions this client reaches
        self._check_sizes(request)
        deadline_ns = request_deadline(request, received_ns, deadline_ns,
                                       self.default_timeout_ns)
        self._inflight += 1
        return deadline_ns

    def _check_sizes(self, request: InferRequest) -> None:
        for name, array in request.inputs.items():
            if array.size > self.max_tensor_elements:
                raise InvalidInput(
                    f"input '{name}' has {array.size} elements (shape {list(array.shape)}); "
                    f"this server accepts at most {self.max_tensor_elements} per tensor "
                    "(--max-tensor-elements)"
                )

    def admit(self, name: str, version: str | None, deadline_ns: int | None = None,
              own_timeout: bool = False) -> None:
        """Refuse at once what infer would refuse before the request is decoded: an unknown
        model or version (404, whatever the body), and load (429: under overload a refusal must
        cost far less than an answer). The transports authorize first, then call this.

        `deadline_ns` (perf_counter_ns) is the transport's (gRPC deadline, Serval-Timeout-Ms);
        without one the server's --default-timeout-ms applies, unless the request may set its
        own `parameters.timeout` (`own_timeout`: not known before decoding; the batcher judges
        it then). A request that could not be answered by its deadline, given the queue ahead
        of it and the model's measured batch times, is refused with a Retry-After.
        """
        self._check_inflight()
        served = self.registry.get(name, version)  # ModelNotFound: 404 before the body
        runner = served.runner
        if runner is not None:
            if deadline_ns is None and self.default_timeout_ns and not own_timeout:
                deadline_ns = time.perf_counter_ns() + self.default_timeout_ns
            try:
                runner.check_capacity(deadline_ns)
            except Overloaded as exc:
                served.stats.record_refusal(exc.code.value)
                raise

    def _check_inflight(self) -> None:
        if self._inflight >= self.max_inflight:
            self.inflight_refusals += 1
            raise Overloaded(f"the server has {self._inflight} requests in flight, its "
                             "limit; retry shortly")

    async def _infer_model(
        self, name: str, version: str | None, request: InferRequest, received_ns: int,
        deadline_ns: int | None,
    ) -> InferResponse:
        """Run one request through the model's runner (its batcher, or a pipeline's steps,
        each of which comes back through here); count it."""
        async with self.registry.acquire(name, version) as served:
            stats = served.stats
            if request.trace is not None:
                request.trace.model_version = served.version
            try:
                metadata = require_metadata(served)
                if metadata.decoupled:  # Triton's words, then what to do
                    raise DecoupledUnary(
                        f"model '{name}' is decoupled (0..n responses per request): a unary "
                        "call (ModelInfer RPC, HTTP infer) doesn't support models with "
                        "decoupled transaction policy; use gRPC ModelStreamInfer")
                validate_request(request, metadata, name)
                assert served.runner is not None
                cached = (await self._cache_lookup(served, request, metadata)
                          if self.registry.cache.capacity else None)
                if cached is not None and cached.outputs is not None:
                    outputs = cached.outputs  # a hit: the model does not run
                else:
                    outputs = await served.runner.infer(request.inputs, deadline_ns, request)
                    if cached is not None:
                        cached.store(outputs)
                selected = _select_outputs(outputs, request)
                if request.outputs and any(o.class_count for o in request.outputs):
                    selected = _classified(selected, request, served, metadata)
            except ServalError as exc:
                stats.record_request(exc.code.value, time.perf_counter_ns() - received_ns)
                raise
            except asyncio.CancelledError:
                stats.record_request("cancelled", time.perf_counter_ns() - received_ns)
                raise
            stats.record_request("success", time.perf_counter_ns() - received_ns)
            return InferResponse(name, served.version, selected, request.id)

    async def _cache_lookup(self, served: ServedModel, request: InferRequest,
                            metadata: ModelMetadata) -> Lookup | None:
        """The request's response cache lookup; None where the model has no cache."""
        spec = served.spec
        if spec is None or not spec.config.response_cache:
            return None
        scope = (served.name, served.version, served.load_number)
        cache = self.registry.cache
        composite = cache.is_composite(scope, spec.config.backend == "pipeline")
        return await look_up(cache, scope, composite, request, served.stats,
                             [o.name for o in metadata.outputs])


def _config_override(value: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if value is None or isinstance(value, dict):
        return value
    if not isinstance(value, str):
        raise InvalidInput("parameter 'config' must be a JSON object of config.yaml settings, "
                           "or that object as JSON text (or Triton's JSON form of a model "
                           "config)")
    return json_object(value, "parameter 'config'", "a JSON object of config.yaml settings")


def _select_outputs(outputs: TensorDict, request: InferRequest) -> TensorDict:
    if not request.outputs:
        return outputs
    return {output.name: outputs[output.name] for output in request.outputs}


def _classified(outputs: TensorDict, request: InferRequest, served: ServedModel,
                metadata: ModelMetadata) -> TensorDict:
    """Outputs asked for with a class count, replaced by their top classes (BYTES)."""
    counts = {o.name: o.class_count for o in request.outputs or () if o.class_count}
    return {name: classify(array, counts[name], metadata.max_batch_size > 0,
                           output_labels(served, name), name) if name in counts else array
            for name, array in outputs.items()}


def output_labels(served: ServedModel, output: str) -> list[str] | None:
    """The class labels of one output: the model config's `labels` for it (config.pbtxt's
    label_filename, or config.yaml's `labels: {output: [...]}`); None without any."""
    return served.spec.config.labels.get(output) if served.spec else None


def require_metadata(served: ServedModel) -> ModelMetadata:
    """What the loaded model accepts and returns; ModelNotReady (with why) when not loaded."""
    if served.model is None:
        raise ModelNotReady(not_ready_message(served))
    return served.model.metadata
