"""BLS over a worker's pipe: a child's call reaches the parent's caller and its answer (outputs
or error text) comes back, to its own caller however many call together: the callers read the
pipe in turn, or a reader routes the replies."""

from __future__ import annotations

import threading
from multiprocessing import Pipe
from typing import Any

import numpy as np
import pytest

from serval.backends import bls
from serval.errors import BackendError, ModelNotFound
from serval.protocol.types import InferRequest, TensorDict

pytestmark = pytest.mark.unit


class Caller:
    """The data plane's side, as a ModelCaller: doubles X of model 'twice'; others unknown."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, InferRequest, float | None]] = []

    def __call__(self, model: str, version: str | None, request: InferRequest,
                 timeout_s: float | None, abandon: threading.Event) -> TensorDict:
        self.seen.append((model, version, request, timeout_s))
        if model == "broken":
            raise BackendError("engine exploded at 0x7f: internal detail")
        if model != "twice":
            raise ModelNotFound(f"Request for unknown model: '{model}' is not found")
        return {"Y": request.inputs["X"] * 2, "TEXT": np.array([b"a", b"bc"], dtype=object)}


def _parent(conn: Any, caller: Caller, calls: int) -> threading.Thread:
    """What IsolatedModel._exchange does while a batch runs: answer the child's calls."""
    send_lock = threading.Lock()

    def serve() -> None:
        for _ in range(calls):
            kind, head = conn.recv()
            assert kind == bls.CALL
            bls.answer_call_later(conn, head, caller, "model 'm'", threading.Event(), send_lock,
                                  bls.spawn_thread)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_a_call_and_its_reply_when_the_caller_reads_it() -> None:
    child, parent = Pipe()
    caller = Caller()
    serving = _parent(parent, caller, 3)
    channel = bls.ChildChannel(child)
    x = np.arange(4, dtype=np.float32)
    answer = channel.call("twice", "2", {"X": x}, ["Y"], {"k": "v"}, 1500)
    assert isinstance(answer, dict)
    np.testing.assert_array_equal(answer["Y"], x * 2)
    assert answer["TEXT"].tolist() == [b"a", b"bc"]
    model, version, request, timeout_s = caller.seen[0]
    assert (model, version, timeout_s) == ("twice", "2", 0.0015)
    assert request.parameters == {"k": "v"}
    assert [o.name for o in request.outputs or []] == ["Y"]
    assert channel.call("nothing", None, {"X": x}, None, {}, 0) == (
        "Request for unknown model: 'nothing' is not found")
    assert caller.seen[1][3] is None  # no timeout: no deadline
    assert channel.call("broken", None, {"X": x}, None, {}, 0) == (
        BackendError.public_message)  # another model's failure, as its clients see it
    serving.join(5)


def _answer_in_reverse(parent: Any, caller: Caller, calls: int) -> None:
    """The parent's side, answering once every call is in: the last one first."""
    heads = []
    for _ in range(calls):
        _, head = parent.recv()
        heads.append(bls.read_call(parent, head))
    for head, inputs in reversed(heads):
        bls.send_reply(parent, head[0], bls.run_call(caller, head, inputs, "m",
                                                     threading.Event()))


def _call_together(channel: bls.ChildChannel, calls: int) -> dict[int, Any]:
    answers: dict[int, Any] = {}

    def call(index: int) -> None:
        answers[index] = channel.call("twice", None, {"X": np.full(2, index, np.int64)},
                                      None, {}, 0)

    threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    return answers


def test_calls_made_together_are_in_flight_together_and_each_gets_its_reply() -> None:
    """As gathered async_exec() calls: all reach the parent before any is answered (one call
    at a time would wait forever here), and the callers, reading the pipe in turn, each get
    their own reply though the replies come back in reverse."""
    child, parent = Pipe()
    channel = bls.ChildChannel(child)
    calls = 6
    threading.Thread(target=_answer_in_reverse, args=(parent, Caller(), calls),
                     daemon=True).start()
    answers = _call_together(channel, calls)
    assert {i: answer["Y"].tolist() for i, answer in answers.items()} == {
        i: [2 * i, 2 * i] for i in range(calls)}


def test_replies_routed_by_a_reader_reach_each_waiting_thread() -> None:
    child, parent = Pipe()
    send_lock = threading.Lock()
    channel = bls.ChildChannel(child, send_lock, routed=True)
    calls = 6

    def reader() -> None:  # what ChildStreams._read does with REPLY messages
        for _ in range(calls):
            kind, reply = child.recv()
            assert kind == bls.REPLY
            channel.deliver(reply)

    threading.Thread(target=_answer_in_reverse, args=(parent, Caller(), calls),
                     daemon=True).start()
    threading.Thread(target=reader, daemon=True).start()
    answers = _call_together(channel, calls)
    assert {i: answer["Y"].tolist() for i, answer in answers.items()} == {
        i: [2 * i, 2 * i] for i in range(calls)}


def test_a_call_without_a_caller_and_calls_waiting_when_the_pipe_closes() -> None:
    head = (1, "twice", None, None, {}, 0)
    assert "not available" in str(bls.run_call(None, head, {}, "model 'm'", threading.Event()))
    child, _parent_end = Pipe()
    channel = bls.ChildChannel(child, routed=True)
    waiting: list[Any] = []
    thread = threading.Thread(target=lambda: waiting.append(
        channel.call("twice", None, {"X": np.zeros(1)}, None, {}, 0)))
    thread.start()
    while not channel._waiting:  # the call is sent and waits for its reply
        thread.join(0.01)
    channel.close()
    thread.join(5)
    assert waiting == ["the server stopped serving this model"]
    assert channel.call("twice", None, {}, None, {}, 0) == waiting[0]  # and any call after
