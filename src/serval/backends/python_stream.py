"""Serval's own decoupled Python models: a `Model` whose infer(inputs) is a generator yields
0..n output dicts per request, each sent to the client as it is yielded; the request ends (its
final flag) when the generator returns.

The generator runs on the model's engine thread for as long as it yields, so `instances`
bounds the streams that run at once; it is closed as soon as the client goes away (the
request is cancelled), and its sends wait while the client is its window behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from serval.backends.base import ModelMetadata, ModelResponse, ResponseSink, StreamRequest
from serval.backends.model_code import MODEL_EXITS, model_exception, unload_instance
from serval.errors import BackendError, ModelFailed, ServalError, shown
from serval.protocol.dtypes import v2_datatype
from serval.protocol.types import InferRequest, TensorDict


class GeneratorModel:
    """A decoupled Python model (a RequestModel whose requests carry their sinks)."""

    def __init__(self, name: str, instance: Any, metadata: ModelMetadata,
                 size_bytes: int) -> None:
        self._name, self._instance, self._size_bytes = name, instance, size_bytes
        self._metadata = metadata
        self._names = [spec.name for spec in metadata.outputs]
        self._datatypes = {spec.name: spec.datatype for spec in metadata.outputs}

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def memory_bytes(self) -> int:
        return self._size_bytes

    def infer(self, inputs: TensorDict) -> TensorDict:
        raise BackendError(f"model '{self._name}' is decoupled: it answers streamed requests")

    def infer_requests(self, requests: Sequence[InferRequest]
                       ) -> list[TensorDict | ServalError]:
        """Each request's stream in turn; a request whose generator fails gets that error
        (its stream ends with it)."""
        return [self._stream(request) for request in requests]

    def _stream(self, request: InferRequest) -> TensorDict | ServalError:
        if not isinstance(request, StreamRequest) or request.sink is None:
            return BackendError(f"model '{self._name}' is decoupled: its requests need a "
                                "response stream")
        sink: ResponseSink = request.sink
        responses = None
        try:
            responses = self._instance.infer(request.inputs)
            for outputs in responses:
                if sink.is_cancelled():
                    break
                sink.send(ModelResponse(outputs=self._checked(outputs)))
        except ServalError as exc:
            return exc
        except (Exception, *MODEL_EXITS) as exc:
            error = ModelFailed(f"model '{self._name}': infer() raised {model_exception(exc)}")
            error.__cause__ = exc
            return error
        finally:
            if responses is not None:
                with contextlib.suppress(Exception, *MODEL_EXITS):
                    responses.close()
        sink.send(ModelResponse(final=True))
        return {}

    def _checked(self, outputs: Any) -> TensorDict:
        if not isinstance(outputs, dict) or any(name not in outputs for name in self._names):
            got = sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__
            raise ModelFailed(f"model '{self._name}': infer() must yield dicts with "
                              f"{shown(self._names, 200)}, got {shown(got, 200)}")
        return {name: self._declared(name, outputs[name]) for name in self._names}

    def _declared(self, name: str, value: Any) -> Any:
        """An output as its config declares it: a yielded list, string or None reached the
        encoders (an internal error, a traceback), an FP64 array went out as FP64 to clients
        told INT32."""
        declared = self._datatypes[name]
        try:
            datatype = v2_datatype(value.dtype) if isinstance(value, np.ndarray) else None
        except ValueError:
            datatype = None
        if datatype != declared:
            got = f"{datatype} array" if datatype else type(value).__name__
            raise ModelFailed(f"model '{self._name}': infer() yielded output '{name}' as a "
                              f"{got}; its config says a numpy array of {declared}")
        if declared == "BYTES" and value.dtype.kind != "O":
            return value.astype(np.object_)
        return value

    def unload(self) -> None:
        unload_instance(self._name, self._instance)
