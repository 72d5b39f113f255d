"""Decoupled models in a worker process: responses stream back over the pipe as the model
sends them, cancellations and flow control go down it while the model runs.

Parent: a reader thread routes what the child sends (each request's responses, each batch's
end of execute()) and a writer thread sends control messages (a response taken by the client,
a request cancelled), so the event loop never touches the pipe. Child: the main thread reads
the pipe (requests, control) while one thread runs execute() a batch at a time, and the
model's own threads send responses; each request may have `window` responses unacknowledged
by the parent, beyond which its sender waits (the parent acknowledges each response its client
takes, so a client that stops reading stops its model, never fills memory).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from serval.backends import bls
from serval.backends.base import (
    Engine,
    LoadedModel,
    ModelResponse,
    ModelVersionSpec,
    RequestModel,
    ResponseSink,
    StreamRequest,
)
from serval.backends.isolated import IsolatedBackend, IsolatedModel, IsolatedRequestModel
from serval.backends.isolated_child import load_in_child, serve_child
from serval.backends.isolated_pool import Instance, pooled, start_instances
from serval.backends.model_code import MODEL_EXITS, model_exception
from serval.backends.pipe_requests import recv_requests, recv_results, send_requests, send_results
from serval.backends.pipe_responses import RESPONSE as _RESPONSE
from serval.backends.pipe_responses import recv_response, send_response
from serval.backends.worker_guard import end_group
from serval.errors import BackendError, ServalError, ServerUnavailable
from serval.protocol.types import InferRequest, TensorDict

log = logging.getLogger(__name__)

_STREAMS = "streams"  # parent -> child: a batch of requests, each with its stream id
_CONTROL = "control"  # parent -> child: [(ack | cancel, stream id, count)]
_EXECUTED = "executed"  # child -> parent: a batch's execute() returned (results follow)
_FAILED = "failed"  # child -> parent: a batch's execute() raised
STOP_WRITER_S = 5.0


class StreamingIsolatedBackend(IsolatedBackend):
    """IsolatedBackend whose children serve decoupled models too."""

    def load(self, spec: ModelVersionSpec) -> LoadedModel:
        """A worker process per instance (instance_group count), as Triton's stub processes;
        one for a sequence model, whose per-sequence state must stay in one process (the
        sequencer may run a sequence's next step on any instance)."""
        count = 1 if spec.config.sequence_batching is not None else spec.config.instances
        return pooled(start_instances(
            count, lambda index: self._load_one(replace(spec, instance=index))))

    def _load_one(self, spec: ModelVersionSpec) -> Instance:
        model = IsolatedModel(self.inner, spec, child_target=stream_child_main,
                              caller=self.caller)
        if model.metadata.decoupled:
            return IsolatedStreamModel(model)
        return IsolatedRequestModel(model) if model.takes_requests else model


class IsolatedStreamModel(IsolatedRequestModel):
    """A decoupled model in its worker process (a RequestModel whose requests carry sinks)."""

    def __init__(self, model: IsolatedModel) -> None:
        super().__init__(model)
        self._pipe: StreamPipe | None = None
        self._lock = threading.Lock()

    def infer(self, inputs: TensorDict) -> TensorDict:
        raise BackendError("a decoupled model answers streamed requests only")

    def infer_requests(self, requests: Sequence[InferRequest]
                       ) -> list[TensorDict | ServalError]:
        return self._current_pipe().execute(requests)

    def _current_pipe(self) -> StreamPipe:
        conn = self.isolated.connection()
        with self._lock:
            if self._pipe is None or self._pipe.conn is not conn:
                self._pipe = StreamPipe(conn, lambda: self.isolated.lost(conn),
                                        self.isolated)
            return self._pipe

    def unload(self) -> None:
        with self._lock:
            pipe, self._pipe = self._pipe, None
        if pipe is not None:
            pipe.close(ServerUnavailable("the model was unloaded"))
        self.isolated.unload()


class StreamPipe:
    """The parent's end of one child's pipe for a decoupled model."""

    def __init__(self, conn: Connection, on_lost: Callable[[], ServalError],
                 model: IsolatedModel | None = None) -> None:
        self.conn = conn
        self._on_lost = on_lost
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # the tables below
        self._streams: dict[int, ResponseSink] = {}
        self._batches: dict[int, Future[list[TensorDict | ServalError]]] = {}
        self._batch_streams: dict[int, list[int]] = {}  # a running batch's requests' streams
        self._ids = itertools.count(1)
        self._control: queue.SimpleQueue[tuple[str, int] | None] = queue.SimpleQueue()
        self._closed = False
        self._calls = bls.ParentCalls(  # answered on threads: responses go on meanwhile
            conn, model.caller if model else None, model.label if model else "this model",
            model.abandon if model else threading.Event(), self._send_lock,
            own=model.name if model else "")
        threading.Thread(target=self._read, daemon=True, name="serval-stream-reader").start()
        self._writer = threading.Thread(target=self._write_control, daemon=True,
                                        name="serval-stream-control")
        self._writer.start()

    def execute(self, requests: Sequence[InferRequest]) -> list[TensorDict | ServalError]:
        """Send the batch, wait for its execute() to return; responses go to the sinks."""
        sinks = [_sink_of(request) for request in requests]
        future: Future[list[TensorDict | ServalError]] = Future()
        with self._lock:
            if self._closed:
                raise BackendError("the model's worker process stopped")
            batch_id = next(self._ids)
            stream_ids = [next(self._ids) for _ in requests]
            self._batches[batch_id] = future
            self._batch_streams[batch_id] = stream_ids
            self._streams.update(zip(stream_ids, sinks, strict=True))
        self._calls.running(requests)  # its calls' callers (model threads' later ones too)
        with self._send_lock:
            self.conn.send((_STREAMS, batch_id, stream_ids, [s.window for s in sinks]))
            send_requests(self.conn, requests)
        for stream_id, sink in zip(stream_ids, sinks, strict=True):
            self._relay(stream_id, sink)
        return future.result()

    def _relay(self, stream_id: int, sink: ResponseSink) -> None:
        """The client's takes and its going away, relayed to the child."""
        def taken() -> None:
            self._control.put(("ack", stream_id))

        sink.relay(taken, lambda: self._cancel(stream_id))
        if sink.is_cancelled():  # before the relay was in place
            self._cancel(stream_id)

    def _cancel(self, stream_id: int) -> None:
        with self._lock:
            self._streams.pop(stream_id, None)
        self._control.put(("cancel", stream_id))

    def close(self, error: ServalError) -> None:
        """Stop routing: open streams and batches end with `error`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            streams, self._streams = self._streams, {}
            batches, self._batches = self._batches, {}
        self._control.put(None)
        if threading.current_thread() is not self._writer:
            self._writer.join(STOP_WRITER_S)  # nothing of it on the pipe once it is closed
        for future in batches.values():
            if not future.done():
                future.set_exception(error)
        for sink in streams.values():
            sink.forward(ModelResponse(error=error, final=True))

    def _read(self) -> None:
        try:
            while True:
                message = self.conn.recv()
                if message[0] == _RESPONSE:
                    self._route(message[1], recv_response(self.conn, message[2], message[3]))
                elif message[0] == _EXECUTED:
                    self._finish(message[1], recv_results(self.conn, self.conn.recv()[1]))
                elif self._calls.handle(message):  # a BLS call, or its cancel
                    continue
                else:  # _FAILED
                    self._finish(message[1], BackendError(
                        f"the model raised in its worker process: {message[2]}"))
        except (EOFError, OSError):
            if not self._closed:
                self.close(self._on_lost())

    def _route(self, stream_id: int, response: ModelResponse) -> None:
        with self._lock:
            sink = (self._streams.pop(stream_id, None) if response.final
                    else self._streams.get(stream_id))
        if sink is not None:
            sink.forward(response)

    def _finish(self, batch_id: int,
                results: list[TensorDict | ServalError] | BackendError) -> None:
        """A request whose execute() failed is over (its stream ends with the error): it is
        cancelled in the child, else the model's threads could send to it for ever, unread."""
        with self._lock:
            future = self._batches.pop(batch_id, None)
            stream_ids = self._batch_streams.pop(batch_id, [])
        ended = ([True] * len(stream_ids) if isinstance(results, BackendError)
                 else [isinstance(result, ServalError) for result in results])
        for stream_id, over in zip(stream_ids, ended, strict=False):
            if over:
                self._cancel(stream_id)
        if future is None or future.done():
            return
        if isinstance(results, BackendError):
            future.set_exception(results)
        else:
            future.set_result(results)

    def _write_control(self) -> None:
        """Acks and cancels, gathered into one message while the writer was busy."""
        while (first := self._control.get()) is not None:
            counts: dict[tuple[str, int], int] = {first: 1}
            stop = False
            while not self._control.empty():
                item = self._control.get_nowait()
                if item is None:
                    stop = True
                    break
                counts[item] = counts.get(item, 0) + 1
            try:
                with self._send_lock:
                    self.conn.send((_CONTROL, [(a, sid, n) for (a, sid), n in counts.items()]))
            except (OSError, ValueError):
                return
            if stop:
                return


def _sink_of(request: InferRequest) -> ResponseSink:
    if not isinstance(request, StreamRequest) or request.sink is None:
        raise BackendError("a decoupled model's requests need a response stream")
    return request.sink


# the child ----------------------------------------------------------------------------------

def stream_child_main(conn: Connection, backend: Engine, spec: ModelVersionSpec) -> None:
    """The worker process (isolated_child.child_main's), serving a decoupled model's streams."""
    model = load_in_child(conn, backend, spec)
    if model is None:
        return
    try:
        if model.metadata.decoupled and isinstance(model, RequestModel):
            ChildStreams(conn, model).serve()
        else:
            serve_child(conn, model)
    finally:
        model.unload()
        end_group()


class ChildStreams:
    """The child's side: read requests and control, run execute() on a thread of its own."""

    def __init__(self, conn: Connection, model: RequestModel) -> None:
        self.conn, self.model = conn, model
        self.send_lock = threading.Lock()
        self.bls = bls.ChildChannel(conn, self.send_lock, routed=True)
        bls.install(self.bls)
        self.sinks: dict[int, ChildSink] = {}
        self._work: queue.SimpleQueue[tuple[int, list[InferRequest]] | None] = (
            queue.SimpleQueue())

    def serve(self) -> None:
        worker = threading.Thread(target=self._execute_batches, daemon=True,
                                  name="serval-execute")
        worker.start()
        try:
            self._read()
        finally:
            self.bls.close()  # calls waiting for a reply get an error
            for sink in list(self.sinks.values()):
                sink.cancel()  # senders waiting for room wake; what they send is dropped
            self._work.put(None)
            worker.join()

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                return  # the parent is gone
            if message[0] == _STREAMS:
                _, batch_id, stream_ids, windows = message
                heads = self.conn.recv()[1]
                requests = recv_requests(self.conn, heads)
                self._work.put((batch_id, [self._stream_request(request, sid, window)
                                           for request, sid, window
                                           in zip(requests, stream_ids, windows, strict=True)]))
            elif message[0] == bls.REPLY:
                self.bls.deliver(message[1])
            elif message[0] == _CONTROL:
                for action, stream_id, count in message[1]:
                    sink = self.sinks.get(stream_id)
                    if sink is not None:
                        sink.credit(count) if action == "ack" else sink.cancel()
            else:  # STOP
                return

    def _stream_request(self, request: InferRequest, stream_id: int, window: int
                        ) -> StreamRequest:
        sink = ChildSink(self, stream_id, window)
        self.sinks[stream_id] = sink
        return StreamRequest(request.inputs, request.outputs, request.id, request.parameters,
                             request.binary_output, sink=sink)

    def _execute_batches(self) -> None:
        while (item := self._work.get()) is not None:
            batch_id, requests = item
            try:
                results = self.model.infer_requests(requests)
            except (Exception, *MODEL_EXITS) as exc:  # sys.exit() ended this thread: wedged
                self._send((_FAILED, batch_id, model_exception(exc)))
                continue
            with self.send_lock:
                self.conn.send((_EXECUTED, batch_id))
                send_results(self.conn, results)

    def _send(self, message: Any) -> None:
        with self.send_lock:
            self.conn.send(message)


class ChildSink:
    """One request's responses in the child: at most `window` unacknowledged by the parent."""

    def __init__(self, streams: ChildStreams, stream_id: int, window: int) -> None:
        self.window = window
        self._streams, self._id = streams, stream_id
        self._credit = window
        self._room = threading.Condition()
        self._cancelled = False
        self._ended = False
        self._on_taken: Callable[[], None] | None = None  # a generator model keeps its window
        self._on_cancelled: Callable[[], None] | None = None

    def send(self, response: ModelResponse) -> bool:
        with self._room:
            while self._credit <= 0 and not self._cancelled:
                self._room.wait()
            return self._put(response)

    def forward(self, response: ModelResponse) -> None:
        with self._room:
            self._put(response)

    def _put(self, response: ModelResponse) -> bool:
        if self._cancelled or self._ended:
            return False
        self._credit -= 1
        self._ended = response.final
        if self._ended:
            self._streams.sinks.pop(self._id, None)
        with self._streams.send_lock:
            send_response(self._streams.conn, self._id, response)
        return True

    def relay(self, taken: Callable[[], None], cancelled: Callable[[], None]) -> None:
        """A model that forwards (keeping the window itself) is told of each credit and of
        the cancellation."""
        self._on_taken, self._on_cancelled = taken, cancelled

    def is_cancelled(self) -> bool:
        return self._cancelled

    def credit(self, count: int) -> None:
        with self._room:
            self._credit += count
            self._room.notify_all()
        taken = self._on_taken
        if taken is not None:
            for _ in range(count):
                taken()

    def cancel(self) -> None:
        with self._room:
            self._cancelled = True
            self._room.notify_all()
        self._streams.sinks.pop(self._id, None)
        if self._on_cancelled is not None:
            self._on_cancelled()
