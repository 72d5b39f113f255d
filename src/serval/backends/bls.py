"""Triton's business logic scripting (BLS): a Python model in its worker process runs inference
on another model of the server (`pb_utils.InferenceRequest(...).exec()`).

The child sends the call up the model's own pipe, (CALL, (id, model, version, outputs,
parameters, timeout_us)) then the inputs (pipe_tensors), and waits; the parent, which is
waiting for the batch's results on that pipe, reads the inputs and answers the call on a
thread of its own through the data plane's per-model path (a ModelCaller: validated, batched,
counted as a client's request) with (REPLY, (id, error or None)) then the outputs. So calls
made together (`asyncio.gather` of `async_exec()`s, or threads calling `exec()`) run
together, as in Triton, and may share a batch of the model they call.

Replies come back in any order and go to their callers by id. A child that reads its pipe on
a thread of its own (a decoupled model's) hands them over (`deliver`); otherwise the waiting
callers take turns reading the pipe, each delivering whatever reply comes, until its own has.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from serval.backends.base import ModelCaller
from serval.backends.pipe_tensors import recv_tensors, send_tensors
from serval.errors import BackendError, ServalError
from serval.protocol.types import InferRequest, RequestedOutput, TensorDict

CALL = "bls"  # child -> parent
REPLY = "bls-reply"  # parent -> child
Head = tuple[int, str, str | None, list[str] | None, dict[str, Any], int]
Answer = TensorDict | str  # the outputs, or why there are none
STOPPED = "the server stopped serving this model"


class ChildChannel:
    """The child's end of BLS on one pipe. `send_lock` guards the pipe's writes when other
    threads write to it too; with `routed`, replies come in through `deliver` (the thread that
    reads the pipe calls it), else the callers waiting read them in turn."""

    def __init__(self, conn: Connection, send_lock: threading.Lock | None = None,
                 routed: bool = False) -> None:
        self._conn, self._routed = conn, routed
        self._send_lock = send_lock or threading.Lock()
        self._reading = threading.Lock()  # unrouted: the caller reading the pipe now
        self._ids = itertools.count(1)
        self._waiting: dict[int, Future[Answer]] = {}
        self._closed = False

    def call(self, model: str, version: str | None, inputs: TensorDict,
             outputs: list[str] | None, parameters: dict[str, Any], timeout_us: int) -> Answer:
        call_id = next(self._ids)
        head: Head = (call_id, model, version, outputs, parameters, timeout_us)
        answer: Future[Answer] = Future()
        self._waiting[call_id] = answer
        if self._closed:  # after close() (or during it): nobody will deliver
            self._waiting.pop(call_id, None)
            return STOPPED
        with self._send_lock:
            self._conn.send((CALL, head))
            send_tensors(self._conn, inputs)
        while not self._routed and not answer.done():
            with self._reading:  # one reader at a time; each reply read goes to its caller
                if not answer.done():
                    _, reply = self._conn.recv()
                    self.deliver(reply)
        return answer.result()

    def deliver(self, reply: tuple[int, str | None]) -> None:
        """A REPLY read by the pipe's reader: its outputs follow on the pipe."""
        call_id, error = reply
        answer: Answer = error if error is not None else recv_tensors(self._conn)
        waiting = self._waiting.pop(call_id, None)
        if waiting is not None:
            waiting.set_result(answer)

    def close(self) -> None:
        """The pipe is gone: calls still waiting, and any made after, get an error."""
        self._closed = True
        for call_id in list(self._waiting):
            waiting = self._waiting.pop(call_id, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(STOPPED)


_channel: ChildChannel | None = None  # this worker process's, once it serves


def install(channel: ChildChannel) -> None:
    global _channel
    _channel = channel


def current() -> ChildChannel | None:
    return _channel


# the parent ------------------------------------------------------------------------------------

def read_call(conn: Connection, head: Head) -> tuple[Head, TensorDict]:
    return head, recv_tensors(conn)


def run_call(caller: ModelCaller | None, head: Head, inputs: TensorDict, label: str,
             abandon: threading.Event) -> Answer:
    """One BLS call through the data plane: the outputs, or the error's text."""
    _, model, version, outputs, parameters, timeout_us = head
    if caller is None:
        return f"{label}: business logic scripting is not available here"
    request = InferRequest(inputs, parameters=dict(parameters),
                           outputs=None if outputs is None
                           else [RequestedOutput(name) for name in outputs])
    try:
        return caller(model, version, request, timeout_us / 1e6 if timeout_us else None,
                      abandon)
    except BackendError as exc:  # another model's failure: what its clients would see
        return exc.public_message
    except ServalError as exc:
        return exc.message
    except Exception as exc:  # the model gets the reason, the server goes on
        return f"{type(exc).__name__}: {exc}"


def send_reply(conn: Connection, call_id: int, answer: Answer,
               send_lock: threading.Lock | None = None) -> None:
    with send_lock or contextlib.nullcontext():
        if isinstance(answer, str):
            conn.send((REPLY, (call_id, answer)))
            return
        conn.send((REPLY, (call_id, None)))
        send_tensors(conn, answer)


def answer_call_later(conn: Connection, head: Head, caller: ModelCaller | None, label: str,
                      abandon: threading.Event, send_lock: threading.Lock,
                      spawn: Callable[[Callable[[], None]], None]) -> None:
    """Read one CALL's inputs now (the reader must go on); run it and reply on `spawn`."""
    head, inputs = read_call(conn, head)

    def run() -> None:
        answer = run_call(caller, head, inputs, label, abandon)
        with contextlib.suppress(OSError, ValueError):  # the child gone: nobody waits
            send_reply(conn, head[0], answer, send_lock)

    spawn(run)


def spawn_thread(work: Callable[[], None]) -> None:
    """Run one BLS call on a thread of its own (calls made together run together)."""
    threading.Thread(target=work, daemon=True, name="serval-bls-call").start()
