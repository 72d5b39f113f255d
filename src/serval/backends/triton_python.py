"""Triton Python-backend models: a model.py whose `TritonPythonModel` has initialize(args),
execute(requests) -> responses, finalize() and optionally auto_complete_config(config).

execute() gets the batch the batcher formed as its list of requests, one per client request
(never merged); an InferenceResponse(error=TritonError(...)) fails its own request with a 400.
A decoupled model's execute() returns None and sends each request's responses through its
response sender, to the request's sink (backends.base.StreamRequest), from any thread.
The python backend runs these models in a worker process (backends/python.py).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from serval.backends import triton_utils as pb_utils
from serval.backends.base import ModelMetadata, ModelResponse, ModelVersionSpec, StreamRequest
from serval.backends.model_code import MODEL_EXITS, model_exception
from serval.backends.triton_config import (
    initialize_args,
    metadata_from_config,
    triton_model_config,
)
from serval.errors import BackendError, ConfigError, EngineRejectedInput, ServalError
from serval.protocol.dtypes import v2_datatype
from serval.protocol.types import InferRequest, TensorDict, TensorSpec

CLASS_NAME = "TritonPythonModel"
UTILS_MODULE = "triton_python_backend_utils"
# request parameters Triton reads itself and keeps out of InferenceRequest.parameters()
RESERVED_PARAMETERS = frozenset({
    "sequence_id", "sequence_start", "sequence_end", "priority", "timeout",
    "binary_data_output", "binary_data", "binary_data_size", "headers",
})


def defines_triton_model(path: Path) -> bool:
    """Whether model.py defines `class TritonPythonModel` at its top level (read, not run:
    the server decides where to run it before any of its code runs)."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return False
    return any(isinstance(node, ast.ClassDef) and node.name == CLASS_NAME for node in tree.body)


def provide_utils() -> None:
    """Make `import triton_python_backend_utils` resolve to Serval's module (triton_utils)."""
    sys.modules.setdefault(UTILS_MODULE, pb_utils)


def load_triton_model(model_class: type[Any], spec: ModelVersionSpec,
                      size_bytes: int) -> TritonModel:
    """Auto-complete the config, check it, construct the model and initialize(args)."""
    where = f"model '{spec.name}'"
    if not callable(getattr(model_class, "execute", None)):
        raise ConfigError(f"{where}: {CLASS_NAME} must define execute(self, requests)")
    model_config = triton_model_config(spec)
    auto_complete = getattr(model_class, "auto_complete_config", None)
    if callable(auto_complete):
        model_config = _auto_complete(auto_complete, model_config, where)
    metadata = metadata_from_config(model_config, where)
    try:
        instance = model_class()
        initialize = getattr(instance, "initialize", None)
        if callable(initialize):
            initialize(initialize_args(spec, model_config))
    except (Exception, *MODEL_EXITS) as exc:  # sys.exit() too: a load error, said as such
        raise ConfigError(f"{where}: initialize() failed: {model_exception(exc)}") from exc
    return TritonModel(instance, metadata, spec, size_bytes)


def _auto_complete(auto_complete: Any, model_config: dict[str, Any],
                   where: str) -> dict[str, Any]:
    try:
        completed = auto_complete(pb_utils.ModelConfig(json.dumps(model_config)))
    except Exception as exc:
        raise ConfigError(f"{where}: auto_complete_config() failed: {exc}") from exc
    if not isinstance(completed, pb_utils.ModelConfig):
        raise ConfigError(f"{where}: auto_complete_config() must return the config it was "
                          f"given, got {type(completed).__name__}")
    return completed.as_dict()


class TritonModel:
    """The loaded TritonPythonModel: each batch goes to execute() as a list of requests."""

    def __init__(self, instance: Any, metadata: ModelMetadata, spec: ModelVersionSpec,
                 size_bytes: int) -> None:
        self._instance, self._metadata, self._size_bytes = instance, metadata, size_bytes
        self._name, self._version = spec.name, int(spec.version)
        states = spec.config.sequence_batching.states if spec.config.sequence_batching else []
        self._state_outputs = [state.output_name for state in states]  # kept by the server
        self._lock = threading.Lock()  # Triton runs one execute() at a time per instance
        self._finalized = False

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def infer(self, inputs: TensorDict) -> TensorDict:
        """One request of these inputs (the warm-up's path); its error is raised."""
        result = self.infer_requests([InferRequest(inputs)])[0]
        if isinstance(result, ServalError):
            raise result
        return result

    def infer_requests(self, requests: Sequence[InferRequest]
                       ) -> list[TensorDict | ServalError]:
        if self._metadata.decoupled:
            return self._execute_decoupled(requests)
        pb_requests = [self._pb_request(request) for request in requests]
        responses = self._execute(pb_requests)
        if not isinstance(responses, list | tuple) or len(responses) != len(requests):
            got = (len(responses) if isinstance(responses, list | tuple)
                   else type(responses).__name__)
            raise BackendError(f"model '{self._name}': execute() must return one "
                               f"InferenceResponse per request ({len(requests)}), got {got}")
        return [self._result(response, pb_request.requested_output_names())
                for response, pb_request in zip(responses, pb_requests, strict=True)]

    def _execute_decoupled(self, requests: Sequence[InferRequest]
                           ) -> list[TensorDict | ServalError]:
        """execute() with a response sender per request; an empty result per request once
        it returns (None, as Triton requires), the responses going to each request's sink."""
        pb_requests = []
        for request in requests:
            if not isinstance(request, StreamRequest) or request.sink is None:
                raise BackendError(f"model '{self._name}' is decoupled: its requests need a "
                                   "response stream")
            pb_requests.append(self._pb_request(request, self._sender(request)))
        returned = self._execute(pb_requests)
        if returned is not None:
            raise BackendError(f"model '{self._name}' is decoupled: execute() must return "
                               f"None (it sends responses), it returned {type(returned).__name__}")
        return [{} for _ in requests]

    def _execute(self, pb_requests: list[pb_utils.InferenceRequest]) -> Any:
        """execute(), one batch at a time; an `async def execute` (which awaits
        async_exec() calls) runs to its end on an event loop of its own."""
        with self._lock:
            returned = self._instance.execute(pb_requests)
            return asyncio.run(returned) if inspect.iscoroutine(returned) else returned

    def _sender(self, request: StreamRequest) -> pb_utils.InferenceResponseSender:
        sink = request.sink
        assert sink is not None
        wanted = ([output.name for output in request.outputs] if request.outputs
                  else [spec.name for spec in self._metadata.outputs])

        def deliver(response: pb_utils.InferenceResponse | None, final: bool) -> None:
            result = None if response is None else self._result(response, wanted)
            if isinstance(result, ServalError):
                sink.send(ModelResponse(error=result, final=final))
            else:
                sink.send(ModelResponse(outputs=result, final=final))

        return pb_utils.InferenceResponseSender(deliver, sink.is_cancelled)

    def memory_bytes(self) -> int:
        return self._size_bytes

    def unload(self) -> None:
        """finalize(), once."""
        if self._finalized:
            return
        self._finalized = True
        finalize = getattr(self._instance, "finalize", None)
        if callable(finalize):
            with self._lock:
                finalize()

    def _pb_request(self, request: InferRequest,
                    sender: pb_utils.InferenceResponseSender | None = None
                    ) -> pb_utils.InferenceRequest:
        wanted = ([output.name for output in request.outputs] if request.outputs
                  else [spec.name for spec in self._metadata.outputs])
        parameters = {key: value for key, value in request.parameters.items()
                      if key not in RESERVED_PARAMETERS}
        return pb_utils.InferenceRequest(
            [pb_utils.Tensor(name, array) for name, array in request.inputs.items()],
            request_id=request.id or "",
            correlation_id=request.parameters.get("sequence_id", 0),
            requested_output_names=wanted,
            parameters=json.dumps(parameters),
            model_name=self._name,
            model_version=self._version,
            response_sender=sender,
        )

    def _result(self, response: Any, wanted: list[str]) -> TensorDict | ServalError:
        if not isinstance(response, pb_utils.InferenceResponse):
            return BackendError(f"model '{self._name}': execute() returned a "
                                f"{type(response).__name__}, not a pb_utils.InferenceResponse")
        error = response.error()
        if error is not None:
            message = error.message() if isinstance(error, pb_utils.TritonError) else str(error)
            return EngineRejectedInput(message, message)
        returned = {tensor.name(): tensor.as_numpy() for tensor in response.output_tensors()}
        outputs: TensorDict = {}
        for spec in self._metadata.outputs:
            if spec.name not in returned:
                if spec.name in wanted:
                    return BackendError(f"model '{self._name}': execute() returned no output "
                                        f"'{spec.name}' (it returned {sorted(returned)})")
                continue
            array = _as_declared(returned[spec.name], spec)
            if array is None:
                return BackendError(
                    f"model '{self._name}': output '{spec.name}' is "
                    f"{returned[spec.name].dtype}, its config says {spec.datatype}")
            outputs[spec.name] = array
        for name in self._state_outputs:  # implicit state: the sequence batcher keeps it
            if name in returned and name not in outputs:
                outputs[name] = returned[name]
        return outputs


def _as_declared(array: np.ndarray, spec: TensorSpec) -> np.ndarray | None:
    """The output as its declared datatype carries it (bytes arrays as object arrays); None
    when its dtype is another datatype."""
    try:
        datatype = v2_datatype(array.dtype)
    except ValueError:
        return None
    if datatype != spec.datatype:
        return None
    if datatype == "BYTES" and array.dtype.kind != "O":
        return array.astype(np.object_)
    return array
