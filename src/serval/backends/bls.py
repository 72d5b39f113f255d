"""Triton's business logic scripting (BLS): a Python model in its worker process runs inference
on another model of the server (`pb_utils.InferenceRequest(...).exec()`), and with
`exec(decoupled=True)` iterates that model's responses as they come.

The child sends the call up the model's own pipe, (CALL, (id, model, version, outputs,
parameters, timeout_us, stream)) then the inputs (pipe_tensors), and waits; the parent, which
is waiting for the batch's results on that pipe, reads the inputs and answers the call on a
thread of its own through the data plane's per-model path (a ModelCaller: validated, batched,
counted as a client's request) with (REPLY, (id, error or None, final)) then the outputs: one
final reply, or for a streamed call one per response of the model, the last final. So calls
made together (`asyncio.gather` of `async_exec()`s, or threads calling `exec()`) run
together, as in Triton, and may share a batch of the model they call. (CANCEL, id) from the
child stops a streamed call; its last reply is then the error CANCELLED_TEXT.

A call's request carries the models waiting on it (InferRequest.waiting_models, which no
client can set): a call to one of them is refused, since it would wait behind the very batch
that waits on it (A calls B calls A: both wedged forever).

Replies come back in any order and go to their callers by id. A child that reads its pipe on
a thread of its own (a decoupled model's) hands them over (`deliver`); otherwise one waiting
caller at a time reads the pipe (as does the child's main loop between batches: `receive`),
delivering whatever reply comes, until its own has.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from typing import Any

from serval.backends.base import ModelCaller
from serval.backends.pipe_tensors import (
    encode_tensors,
    recv_tensors,
    send_tensors,
    write_tensors,
)
from serval.errors import BackendError, ServalError
from serval.protocol.types import InferRequest, RequestedOutput, TensorDict

CALL = "bls"  # child -> parent
REPLY = "bls-reply"  # parent -> child
CANCEL = "bls-cancel"  # child -> parent: a streamed call's responses are no longer wanted
Head = tuple[int, str, str | None, list[str] | None, dict[str, Any], int, bool]
Reply = tuple[int, str | None, bool]  # call id, error (None: outputs follow), final
Answer = TensorDict | str  # the outputs, or why there are none
STOPPED = "the server stopped serving this model"
CANCELLED_TEXT = "the request was cancelled"


class ChildChannel:
    """The child's end of BLS on one pipe. `send_lock` guards the pipe's writes when other
    threads write to it too; with `routed`, replies come in through `deliver` (the thread that
    reads the pipe calls it), else the callers waiting and `receive` read them in turn.

    Unrouted, whichever thread reads a message reads all of it (`payload` reads what follows
    a message that is not a reply) before another may read: a call left running after
    execute() returned may read the next batch while waiting for its reply (it leaves it for
    `receive`), and must never read that batch's tensors as a reply."""

    def __init__(self, conn: Connection, send_lock: threading.Lock | None = None,
                 routed: bool = False, payload: Callable[[Any], Any] | None = None) -> None:
        self._conn, self._routed = conn, routed
        self._send_lock = send_lock or threading.Lock()
        self._payload = payload or (lambda message: message)
        self._changed = threading.Condition()  # guards what follows; an answer came
        self._reading = False  # unrouted: a thread is reading the pipe
        self._inbox: deque[Any] = deque()  # unrouted: messages for `receive`, read in full
        self._ids = itertools.count(1)
        self._waiting: dict[int, deque[tuple[Answer, bool]]] = {}
        self._closed = False

    @property
    def send_lock(self) -> threading.Lock:
        """Held by whoever writes to the pipe (a reply of several messages, whole)."""
        return self._send_lock

    def call(self, model: str, version: str | None, inputs: TensorDict,
             outputs: list[str] | None, parameters: dict[str, Any], timeout_us: int) -> Answer:
        """One answer: the outputs, or the error's text."""
        call_id = self.start(model, version, inputs, outputs, parameters, timeout_us, False)
        return self.next(call_id)[0]

    def start(self, model: str, version: str | None, inputs: TensorDict,
              outputs: list[str] | None, parameters: dict[str, Any], timeout_us: int,
              stream: bool) -> int:
        """Send a call; its id, for `next` (and `cancel` when streamed). Inputs that cannot
        be sent raise UnsendableTensor here, nothing written."""
        encoded = encode_tensors(inputs)
        call_id = next(self._ids)
        with self._changed:
            answers: deque[tuple[Answer, bool]] = deque()
            self._waiting[call_id] = answers
            if self._closed:  # after close() (or during it): nobody will deliver
                answers.append((STOPPED, True))
                return call_id
        head: Head = (call_id, model, version, outputs, parameters, timeout_us, stream)
        with self._send_lock:
            self._conn.send((CALL, head))
            write_tensors(self._conn, encoded)
        return call_id

    def next(self, call_id: int) -> tuple[Answer, bool]:
        """The call's next answer and whether it is its last; waits for it."""
        with self._changed:
            answers = self._waiting.get(call_id)
            if answers is None:
                return STOPPED, True
            while not answers:
                if self._routed or self._reading:
                    self._changed.wait()
                    continue
                self._reading = True
                self._changed.release()
                try:
                    self._read_message()
                finally:
                    self._changed.acquire()
                    self._reading = False
                    self._changed.notify_all()
            answer, final = answers.popleft()
            if final:
                del self._waiting[call_id]
            return answer, final

    def cancel(self, call_id: int) -> None:
        """Stop a streamed call: the parent cancels it and ends it with CANCELLED_TEXT."""
        with self._changed:
            if call_id not in self._waiting or self._closed:
                return
        with contextlib.suppress(OSError, ValueError), self._send_lock:
            self._conn.send((CANCEL, call_id))

    def drop(self, call_id: int) -> None:
        """The caller wants no more of this call (an iterator left early): its remaining
        replies are read and thrown away."""
        with self._changed:
            self._waiting.pop(call_id, None)

    def receive(self) -> Any:
        """Unrouted: the pipe's next message that is not a reply, as `payload` read it in full
        (the child's main loop reads here, so a reply to a call still waiting reaches it)."""
        while True:
            with self._changed:
                while self._reading and not self._inbox:
                    self._changed.wait()
                if self._inbox:
                    return self._inbox.popleft()
                self._reading = True
            try:
                self._read_message()
            finally:
                with self._changed:
                    self._reading = False
                    self._changed.notify_all()

    def _read_message(self) -> None:
        """Read one message in full (the reader's turn is held): a reply goes to its caller,
        anything else to the inbox."""
        message = self._conn.recv()
        if message[0] == REPLY:
            self.deliver(message[1])
            return
        message = self._payload(message)
        with self._changed:
            self._inbox.append(message)
            self._changed.notify_all()

    def deliver(self, reply: Reply) -> None:
        """A REPLY read from the pipe: its outputs follow on the pipe."""
        call_id, error, final = reply
        answer: Answer = error if error is not None else recv_tensors(self._conn)
        with self._changed:
            answers = self._waiting.get(call_id)
            if answers is not None:  # else a dropped call's: thrown away
                answers.append((answer, final))
                self._changed.notify_all()

    def close(self) -> None:
        """The pipe is gone: calls still waiting, and any made after, get an error."""
        with self._changed:
            self._closed = True
            for answers in self._waiting.values():
                answers.append((STOPPED, True))
            self._changed.notify_all()


_channel: ChildChannel | None = None  # this worker process's, once it serves


def install(channel: ChildChannel) -> None:
    global _channel
    _channel = channel


def current() -> ChildChannel | None:
    return _channel


# the parent ------------------------------------------------------------------------------------

class ParentCalls:
    """The parent's side of one child's pipe: each call answered on a thread of its own
    (`spawn`), replies written under `send_lock`, streamed calls cancellable by id."""

    def __init__(self, conn: Connection, caller: ModelCaller | None, label: str,
                 abandon: threading.Event, send_lock: threading.Lock,
                 spawn: Callable[[Callable[[], None]], None] | None = None,
                 own: str = "") -> None:
        self._conn, self._caller, self._label = conn, caller, label
        self._own = own
        self.waiting: frozenset[str] = frozenset()  # the models waiting on the batch running
        self._abandon, self._send_lock = abandon, send_lock
        self._spawn = spawn or spawn_thread
        self._streams: dict[int, threading.Event] = {}  # running streamed calls' cancels
        self._running = 0  # calls not yet answered in full
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)

    def running(self, requests: Sequence[InferRequest]) -> None:
        """The batch going down the pipe now: its calls are refused to the models waiting
        on any of its requests."""
        self.waiting = waiting_on(requests)

    def wait_idle(self) -> None:
        """Until every call has its last reply written: a batch's calls are all answered
        before the next batch goes down the pipe (a call the model left running when its
        execute() returned included)."""
        with self._idle:
            while self._running:
                self._idle.wait()

    def handle(self, message: Any) -> bool:
        """Act on a CALL (its inputs are read now: the reader must go on) or a CANCEL; False
        for any other message."""
        if message[0] == CANCEL:
            with self._lock:
                cancelled = self._streams.get(message[1])
            if cancelled is not None:
                cancelled.set()
            return True
        if message[0] != CALL:
            return False
        head: Head = message[1]
        inputs = recv_tensors(self._conn)
        cancelled = threading.Event()
        waiting = self.waiting
        with self._lock:
            self._running += 1
            if head[6]:
                self._streams[head[0]] = cancelled

        def answer() -> None:
            try:
                if head[1] in waiting:
                    self._reply(head[0], _cycle(head[1], self._own), True)
                elif head[6]:
                    self._stream(head, inputs, cancelled, waiting)
                else:
                    self._reply(head[0], self._call(head, inputs, waiting), True)
            finally:
                with self._idle:
                    self._streams.pop(head[0], None)
                    self._running -= 1
                    self._idle.notify_all()

        self._spawn(answer)
        return True

    def _call(self, head: Head, inputs: TensorDict, waiting: frozenset[str]) -> Answer:
        if self._caller is None:
            return f"{self._label}: business logic scripting is not available here"
        try:
            return self._caller(head[1], head[2], self._request(head, inputs, waiting),
                                _timeout_s(head), self._abandon)
        except Exception as exc:  # the model gets the reason, the server goes on
            return _reason(exc)

    def _stream(self, head: Head, inputs: TensorDict, cancelled: threading.Event,
                waiting: frozenset[str]) -> None:
        for answer, final in self._answers(head, inputs, cancelled, waiting):
            if not self._reply(head[0], answer, final) or final:
                return
        self._reply(head[0], CANCELLED_TEXT if cancelled.is_set() else STOPPED, True)

    def _answers(self, head: Head, inputs: TensorDict, cancelled: threading.Event,
                 waiting: frozenset[str]) -> Iterator[tuple[Answer, bool]]:
        if self._caller is None:
            yield f"{self._label}: business logic scripting is not available here", True
            return
        try:
            for outputs, final in self._caller.stream(
                    head[1], head[2], self._request(head, inputs, waiting), _timeout_s(head),
                    self._abandon, cancelled):
                yield (_reason(outputs) if isinstance(outputs, Exception) else outputs), final
        except Exception as exc:
            yield _reason(exc), True

    def _reply(self, call_id: int, answer: Answer, final: bool) -> bool:
        """Write one reply; False when the child is gone (nobody waits)."""
        try:
            with self._send_lock:
                if isinstance(answer, str):
                    self._conn.send((REPLY, (call_id, answer, final)))
                else:
                    self._conn.send((REPLY, (call_id, None, final)))
                    send_tensors(self._conn, answer)
        except (OSError, ValueError):
            return False
        return True


    def _request(self, head: Head, inputs: TensorDict, waiting: frozenset[str]
                 ) -> InferRequest:
        outputs = head[3]
        return InferRequest(inputs, parameters=dict(head[4]),
                            outputs=None if outputs is None
                            else [RequestedOutput(name) for name in outputs],
                            # the called model's own calls are refused to these
                            waiting_models=waiting | {self._own} if self._own else waiting)


def waiting_on(requests: Sequence[InferRequest]) -> frozenset[str]:
    """The models waiting on these requests (BLS calls'; none from a client)."""
    return frozenset().union(*(request.waiting_models for request in requests))


def _cycle(model: str, own: str) -> str:
    return (f"model '{model}' is waiting on this call already (it called '{own}', directly or "
            "through other models): calling it back would wait forever")


def _timeout_s(head: Head) -> float | None:
    return head[5] / 1e6 if head[5] else None


def _reason(exc: BaseException) -> str:
    """What the calling model is told of a failure."""
    if isinstance(exc, BackendError):  # another model's failure: what its clients would see
        return exc.public_message
    if isinstance(exc, ServalError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


def spawn_thread(work: Callable[[], None]) -> None:
    """Run one BLS call on a thread of its own (calls made together run together)."""
    threading.Thread(target=work, daemon=True, name="serval-bls-call").start()
