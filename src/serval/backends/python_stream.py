"""Serval's own decoupled Python models: a `Model` whose infer(inputs) is a generator yields
0..n output dicts per request, each sent to the client as it is yielded; the request ends (its
final flag) when the generator returns.

The generator runs on the model's engine thread while its client keeps up. Once the client is
its window behind, the generator is parked: the engine thread goes on to other requests, and
one thread per model advances the parked generators in turn as their clients take responses
(a client that read slowly or not at all held the model's engine thread, so every other
client of the model waited). A generator is closed as soon as its client goes away (the
request is cancelled).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from serval.backends.base import ModelMetadata, ModelResponse, ResponseSink, StreamRequest
from serval.backends.model_code import MODEL_EXITS, model_exception, unload_instance
from serval.errors import BackendError, ModelFailed, ServalError, ServerUnavailable, shown
from serval.protocol.dtypes import numpy_dtype, v2_datatype
from serval.protocol.types import InferRequest, TensorDict


class GeneratorModel:
    """A decoupled Python model (a RequestModel whose requests carry their sinks)."""

    def __init__(self, name: str, instance: Any, metadata: ModelMetadata,
                 size_bytes: int) -> None:
        self._name, self._instance, self._size_bytes = name, instance, size_bytes
        self._metadata = metadata
        self._names = [spec.name for spec in metadata.outputs]
        self._datatypes = {spec.name: spec.datatype for spec in metadata.outputs}
        self._parked = _Parked(name)

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
        try:
            responses = iter(self._instance.infer(request.inputs))
        except (Exception, *MODEL_EXITS) as exc:
            return self._failed(exc)
        running = _Running(self, request.sink, responses, self._parked.wake)
        result = running.advance()
        if result is None:  # its client is its window behind: not on this thread
            self._parked.park(running)
            return {}
        return result

    def _failed(self, exc: BaseException) -> ServalError:
        if isinstance(exc, ServalError):
            return exc
        error = ModelFailed(f"model '{self._name}': infer() raised {model_exception(exc)}")
        error.__cause__ = exc
        return error

    def _checked(self, outputs: Any) -> TensorDict:
        if not isinstance(outputs, dict) or any(name not in outputs for name in self._names):
            got = sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__
            raise ModelFailed(f"model '{self._name}': infer() must yield dicts with "
                              f"{shown(self._names, 200)}, got {shown(got, 200)}")
        return {name: self._declared(name, outputs[name]) for name in self._names}

    def _declared(self, name: str, value: Any) -> Any:
        return declared_output(self._name, name, self._datatypes[name], value, "yielded")

    def unload(self) -> None:
        self._parked.stop()
        unload_instance(self._name, self._instance)


_FLOATS = frozenset({"FP16", "FP32", "FP64"})


def declared_output(model: str, name: str, declared: str, value: Any, verb: str) -> Any:
    """A copy of an output as its config declares it (BYTES as an object array; a float array
    in the declared float width, as numpy's float64 default makes of plain Python numbers), or
    ModelFailed: a list, string or None reached the encoders (an internal error, a traceback),
    a UINT8 array went out as UINT8 to clients told FP32, an object array as BYTES. A copy (as
    Triton copies a response's tensors): a model that fills a buffer of its own and returns it
    (or a view of it) overwrote one request's answer with the next's before it was sent."""
    try:
        datatype = v2_datatype(value.dtype) if isinstance(value, np.ndarray) else None
    except ValueError:
        datatype = None
    if datatype in _FLOATS and declared in _FLOATS and datatype != declared:
        return value.astype(numpy_dtype(declared))  # a copy
    if datatype != declared:
        got = f"{datatype} array" if datatype else type(value).__name__
        raise ModelFailed(f"model '{model}': infer() {verb} output '{name}' as a {got}; its "
                          f"config says a numpy array of {declared}")
    if declared == "BYTES" and value.dtype.kind != "O":
        return value.astype(np.object_)
    return np.array(value, copy=True)


class _Running:
    """One request's generator and its responses not yet taken by its client (the sink's
    relay tells of each take; forward() never blocks, so the window is kept here)."""

    def __init__(self, model: GeneratorModel, sink: ResponseSink,
                 responses: Iterator[Any], wake: Callable[[], None]) -> None:
        self.model, self.sink, self.responses = model, sink, responses
        self._lock = threading.Lock()
        self._untaken = 0
        self._wake = wake
        sink.relay(self._taken, wake)

    def _taken(self) -> None:
        with self._lock:
            self._untaken -= 1
        self._wake()

    def ready(self) -> bool:
        """Whether advance() has something to do: room for a response, or a cancellation."""
        return self._untaken < self.sink.window or self.sink.is_cancelled()

    def advance(self, most: int | None = None) -> TensorDict | ServalError | None:
        """Responses while the client has room (at most `most`): {} once the stream ended,
        the error that ended it, None while it has more to send."""
        sent = 0
        try:
            while not self.sink.is_cancelled():
                if self._untaken >= self.sink.window or (most is not None and sent >= most):
                    return None
                try:
                    outputs = next(self.responses)
                except StopIteration:
                    self._forward(ModelResponse(final=True))
                    break
                self._forward(ModelResponse(outputs=self.model._checked(outputs)))
                sent += 1
        except (Exception, *MODEL_EXITS) as exc:
            self.close()
            return self.model._failed(exc)
        self.close()
        return {}

    def _forward(self, response: ModelResponse) -> None:
        with self._lock:
            self._untaken += 1
        self.sink.forward(response)

    def close(self) -> None:
        close = getattr(self.responses, "close", None)
        if close is not None:
            with contextlib.suppress(Exception, *MODEL_EXITS):
                close()


class _Parked:
    """A model's parked generators, advanced in turn on a thread of their own as their clients
    take responses (a window's worth each at most before the next one's turn)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._ready = threading.Condition()
        self._streams: list[_Running] = []
        self._thread: threading.Thread | None = None
        self._stopped = False

    def park(self, running: _Running) -> None:
        with self._ready:
            if self._stopped:
                running.close()
                running.sink.forward(ModelResponse(
                    error=ServerUnavailable("the model was unloaded"), final=True))
                return
            self._streams.append(running)
            if self._thread is None:
                self._thread = threading.Thread(target=self._advance, daemon=True,
                                                name=f"serval-parked-{self._name}"[:60])
                self._thread.start()
            self._ready.notify()

    def wake(self) -> None:
        with self._ready:
            self._ready.notify()

    def _advance(self) -> None:
        while True:
            with self._ready:
                while not self._stopped and not (
                        ready := [s for s in self._streams if s.ready()]):
                    self._ready.wait()
                if self._stopped:
                    return
            for running in ready:
                result = running.advance(running.sink.window)
                if result is None:
                    continue
                with self._ready:
                    self._streams.remove(running)
                if isinstance(result, ServalError):
                    running.sink.forward(ModelResponse(error=result, final=True))

    def stop(self) -> None:
        """Unloaded: the parked generators are closed, their requests end with an error."""
        with self._ready:
            self._stopped = True
            streams, self._streams = self._streams, []
            thread = self._thread
            self._ready.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)  # a generator's turn may be under way
        for running in streams:
            running.close()
            running.sink.forward(ModelResponse(
                error=ServerUnavailable("the model was unloaded"), final=True))
