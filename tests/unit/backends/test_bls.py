"""BLS over a worker's pipe: a child's call reaches the parent's caller and its answer (outputs
or error text) comes back, to its own caller however many call together: the callers read the
pipe in turn, or a reader routes the replies. A streamed call (exec(decoupled=True)) gets each
response with its final flag, and may be cancelled."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from multiprocessing import Pipe
from typing import Any

import numpy as np
import pytest

from serval.backends import bls
from serval.backends.pipe_tensors import read_arrays, recv_tensors, send_tensors
from serval.errors import BackendError, ModelNotFound, ServalError
from serval.protocol.types import InferRequest, TensorDict

pytestmark = pytest.mark.unit


class Caller:
    """The data plane's side, as a ModelCaller: doubles X of model 'twice'; streams X, 2X, 3X
    from model 'count' (the last final), or from 'endless' until cancelled; others unknown."""

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

    def stream(self, model: str, version: str | None, request: InferRequest,
               timeout_s: float | None, abandon: threading.Event, cancelled: threading.Event
               ) -> Iterator[tuple[TensorDict | ServalError, bool]]:
        x = request.inputs["X"]
        if model == "count":
            for step in (1, 2, 3):
                yield {"Y": x * step}, step == 3
            return
        if model == "endless":
            step = 0
            while not cancelled.wait(0.001):
                step += 1
                yield {"Y": x * step}, False
            return
        yield ModelNotFound(f"Request for unknown model: '{model}' is not found"), True


def _parent(conn: Any, caller: Caller, messages: int) -> threading.Thread:
    """What IsolatedModel._exchange does while a batch runs: answer the child's calls (and
    cancels), each on a thread of its own."""
    calls = bls.ParentCalls(conn, caller, "model 'm'", threading.Event(), threading.Lock())

    def serve() -> None:
        for _ in range(messages):
            assert calls.handle(conn.recv())
        calls.wait_idle()

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


def _answer_in_reverse(parent: Any, calls: int) -> None:
    """The parent's side, answering once every call is in, the last one first: call i
    (id i + 1) gets Y = 2i."""
    heads = []
    for _ in range(calls):
        kind, head = parent.recv()
        assert kind == bls.CALL
        heads.append((head, recv_tensors(parent)))
    for head, _ in reversed(heads):
        parent.send((bls.REPLY, (head[0], None, True)))
        send_tensors(parent, {"Y": np.full(2, 2 * (head[0] - 1), np.int64)})


def _call_together(channel: bls.ChildChannel, calls: int) -> dict[int, Any]:
    answers: dict[int, Any] = {}

    def call(index: int) -> None:
        answers[index] = channel.call("twice", None, {"X": np.full(2, index, np.int64)},
                                      None, {}, 0)

    threads = []
    for index in range(calls):  # ids 1, 2, ... in this order: each waits for the one before
        threads.append(threading.Thread(target=call, args=(index,), daemon=True))
        threads[-1].start()
        while len(channel._waiting) <= index and threads[-1].is_alive():
            threads[-1].join(0.001)  # (the last call sent, all may be answered at once)
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
    threading.Thread(target=_answer_in_reverse, args=(parent, calls),
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

    threading.Thread(target=_answer_in_reverse, args=(parent, calls),
                     daemon=True).start()
    threading.Thread(target=reader, daemon=True).start()
    answers = _call_together(channel, calls)
    assert {i: answer["Y"].tolist() for i, answer in answers.items()} == {
        i: [2 * i, 2 * i] for i in range(calls)}


def test_a_streamed_call_gets_each_response_with_its_final_flag() -> None:
    child, parent = Pipe()
    serving = _parent(parent, Caller(), 2)
    channel = bls.ChildChannel(child)
    x = np.arange(3, dtype=np.int64)
    call_id = channel.start("count", None, {"X": x}, None, {}, 0, stream=True)
    answers = [channel.next(call_id) for _ in range(3)]
    assert [(a["Y"].tolist(), final) for a, final in answers] == [
        ([0, 1, 2], False), ([0, 2, 4], False), ([0, 3, 6], True)]
    unknown = channel.start("nothing", None, {"X": x}, None, {}, 0, stream=True)
    assert channel.next(unknown) == ("Request for unknown model: 'nothing' is not found", True)
    serving.join(5)
    assert not serving.is_alive()


def test_a_cancelled_stream_ends_with_the_cancelled_error() -> None:
    child, parent = Pipe()
    serving = _parent(parent, Caller(), 2)  # the call, then its cancel
    channel = bls.ChildChannel(child)
    call_id = channel.start("endless", None, {"X": np.ones(1)}, None, {}, 0, stream=True)
    first, final = channel.next(call_id)
    assert isinstance(first, dict) and not final
    channel.cancel(call_id)
    while not final:
        answer, final = channel.next(call_id)
    assert answer == bls.CANCELLED_TEXT
    serving.join(5)
    assert not serving.is_alive()  # the parent's call ended: nothing left running


def _late_call(channel: bls.ChildChannel, parent: Any
               ) -> tuple[threading.Thread, list[Any], Any]:
    """A call from a model thread (to 'twice'), read by the parent: the thread, where its
    answer goes, and the call's head."""
    answers: list[Any] = []
    late = threading.Thread(target=lambda: answers.append(
        channel.call("twice", None, {"X": np.ones(1)}, None, {}, 0)), daemon=True)
    late.start()
    _, head = parent.recv()
    recv_tensors(parent)  # its inputs
    return late, answers, head


def test_a_reply_arriving_after_execute_returned_reaches_its_caller() -> None:
    """A call the model left running when its execute() returned: the child's main loop,
    reading the pipe for the next batch, hands the late reply to the waiting caller and
    returns the next batch message."""
    child, parent = Pipe()
    channel = bls.ChildChannel(child)
    late, answers, head = _late_call(channel, parent)
    got: list[Any] = []
    main_loop = threading.Thread(target=lambda: got.append(channel.receive()), daemon=True)
    main_loop.start()
    parent.send((bls.REPLY, (head[0], "done late", True)))
    parent.send(("next-batch", None))
    main_loop.join(5)
    late.join(5)
    assert got == [("next-batch", None)] and answers == ["done late"]


def test_a_late_call_waiting_for_its_reply_reads_the_next_batch_whole_for_the_main_loop() -> None:
    """The late call's caller is the pipe's reader when the next batch comes down: it reads
    the batch with its tensors (the payload) and leaves it to the main loop, then gets its own
    reply. Before, it took the batch for a reply and the worker died on the pipe's bytes."""
    child, parent = Pipe()

    def payload(message: tuple[str, Any]) -> tuple[str, Any]:
        return message[0], read_arrays(child, message[1]) if message[0] == "tensors" else None

    channel = bls.ChildChannel(child, payload=payload)
    late, answers, head = _late_call(channel, parent)
    while not channel._reading:  # the late caller reads the pipe, waiting for its reply
        late.join(0.01)
    send_tensors(parent, {"batch": np.arange(6, dtype=np.int32)})
    got: list[Any] = []
    main_loop = threading.Thread(target=lambda: got.append(channel.receive()), daemon=True)
    main_loop.start()
    main_loop.join(5)
    parent.send((bls.REPLY, (head[0], None, True)))
    send_tensors(parent, {"Y": np.full(1, 2.0)})
    late.join(5)
    assert [(kind, batch["batch"].tolist()) for kind, batch in got] == [
        ("tensors", list(range(6)))]
    assert [answer["Y"].tolist() for answer in answers] == [[2.0]]


def test_a_call_without_a_caller_and_calls_waiting_when_the_pipe_closes() -> None:
    child, parent = Pipe()
    calls = bls.ParentCalls(parent, None, "model 'm'", threading.Event(), threading.Lock())
    channel = bls.ChildChannel(child)
    threading.Thread(target=lambda: calls.handle(parent.recv()), daemon=True).start()
    assert "not available" in str(channel.call("twice", None, {}, None, {}, 0))
    routed_end, _parent_end = Pipe()
    routed = bls.ChildChannel(routed_end, routed=True)
    waiting: list[Any] = []
    thread = threading.Thread(target=lambda: waiting.append(
        routed.call("twice", None, {"X": np.zeros(1)}, None, {}, 0)))
    thread.start()
    while not routed._waiting:  # the call is sent and waits for its reply
        thread.join(0.01)
    routed.close()
    thread.join(5)
    assert waiting == ["the server stopped serving this model"]
    assert routed.call("twice", None, {}, None, {}, 0) == waiting[0]  # and any call after
