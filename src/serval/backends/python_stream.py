"""Serval's own decoupled Python models: a `Model` whose infer(inputs) is a generator yields
0..n output dicts per request, each sent to the client as it is yielded; the request ends (its
final flag) when the generator returns.

The generator runs on the model's engine thread for as long as it yields, so `instances`
bounds the streams that run at once; it is closed as soon as the client goes away (the
request is cancelled), and its sends wait while the client is its window behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from serval.backends.base import ModelMetadata, ModelResponse, ResponseSink, StreamRequest
from serval.errors import BackendError, ServalError
from serval.protocol.types import InferRequest, TensorDict


class GeneratorModel:
    """A decoupled Python model (a RequestModel whose requests carry their sinks)."""

    def __init__(self, name: str, instance: Any, metadata: ModelMetadata,
                 size_bytes: int) -> None:
        self._name, self._instance, self._size_bytes = name, instance, size_bytes
        self._metadata = metadata
        self._names = [spec.name for spec in metadata.outputs]

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
        responses = self._instance.infer(request.inputs)
        try:
            for outputs in responses:
                if sink.is_cancelled():
                    break
                sink.send(ModelResponse(outputs=self._checked(outputs)))
        except Exception as exc:
            error = BackendError(f"model '{self._name}': infer() failed: {exc!r}")
            error.__cause__ = exc
            return error
        finally:
            responses.close()
        sink.send(ModelResponse(final=True))
        return {}

    def _checked(self, outputs: Any) -> TensorDict:
        if not isinstance(outputs, dict) or any(name not in outputs for name in self._names):
            got = sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__
            raise BackendError(f"infer() must yield dicts with {self._names}, got {got}")
        return {name: outputs[name] for name in self._names}

    def unload(self) -> None:
        unload = getattr(self._instance, "unload", None)
        if callable(unload):
            unload()
