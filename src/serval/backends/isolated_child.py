"""What runs in an isolated model's worker process: load the model, then answer the parent's
batches (or requests) over the pipe until told to stop or the pipe closes. A model's fault
(an exception, sys.exit(), outputs that cannot cross the pipe) is an error reply; only a
crash ends the process."""

from __future__ import annotations

import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from serval.backends import bls
from serval.backends.base import Engine, LoadedModel, ModelVersionSpec, RequestModel
from serval.backends.model_code import MODEL_EXITS, model_exception
from serval.backends.pipe_requests import REQUESTS, recv_requests, send_results
from serval.backends.pipe_tensors import encode_tensors, read_arrays, write_tensors
from serval.backends.worker_guard import end_group, guard_worker
from serval.errors import EngineRejectedInput
from serval.protocol.types import InferRequest, TensorDict

STOP = "stop"  # parent -> child: finish and exit


def child_main(conn: Connection, backend: Engine, spec: ModelVersionSpec) -> None:
    """The worker process: load, then answer batches until told to stop or the pipe closes."""
    model = load_in_child(conn, backend, spec)
    if model is None:
        return
    try:
        serve_child(conn, model)
    finally:
        model.unload()
        end_group()


def load_in_child(conn: Connection, backend: Engine, spec: ModelVersionSpec
                  ) -> LoadedModel | None:
    """In the worker process: load the model and tell the parent (None: it failed, said)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when this one stops
    guard_worker()  # its own process group; gone when the parent is
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        model = backend.load(spec)
    except Exception as exc:
        conn.send(("error", str(exc) or repr(exc)))
        return None
    conn.send(("ready", model.metadata, model.memory_bytes(), isinstance(model, RequestModel)))
    return model


def serve_child(conn: Connection, model: LoadedModel) -> None:
    # execute()'s calls read their replies themselves, and whoever reads a batch reads it whole
    channel = bls.ChildChannel(conn, payload=lambda message: _read_batch(conn, message))
    bls.install(channel)
    while True:
        try:
            kind, batch = channel.receive()  # a late call's reply goes to it
        except (EOFError, OSError):
            return  # the parent is gone
        if kind == STOP:
            return
        answer = _answer_requests if kind == REQUESTS else _answer_batch
        reply = answer(model, batch)
        with channel.send_lock:  # whole: a BLS call from a model thread never cuts into it
            reply(conn)


def _read_batch(conn: Connection, message: tuple[str, Any]) -> tuple[str, Any]:
    """A message from the parent with what follows it: a stop, requests or a batch's arrays."""
    kind, head = message
    if kind == STOP:
        return kind, None
    if kind == REQUESTS:
        return kind, recv_requests(conn, head)
    return kind, read_arrays(conn, head)


Reply = Callable[[Connection], None]


def _answer_batch(model: LoadedModel, inputs: TensorDict) -> Reply:
    """Encoded first: a model's fault (sys.exit(), unsendable outputs) is an error reply."""
    try:
        outputs = encode_tensors(model.infer(inputs))
    except EngineRejectedInput as exc:
        rejected = ("rejected", (exc.message, exc.detail))
        return lambda conn: conn.send(rejected)
    except (Exception, *MODEL_EXITS) as exc:
        return _error(model_exception(exc))

    def send(conn: Connection) -> None:
        conn.send(("ok", None))
        write_tensors(conn, outputs)
    return send


def _answer_requests(model: LoadedModel, requests: list[InferRequest]) -> Reply:
    if not isinstance(model, RequestModel):
        return _error("the engine does not take requests")
    try:
        results = model.infer_requests(requests)
    except (Exception, *MODEL_EXITS) as exc:
        return _error(model_exception(exc))
    return lambda conn: send_results(conn, results)


def _error(detail: str) -> Reply:
    return lambda conn: conn.send(("error", detail))
