"""ModelStreamInfer: the requests of one bidirectional stream, each answered on its own.

Requests of one stream run concurrently (so they batch). A model that is not decoupled answers
each request once, in request order among such requests, as Triton answers them. A decoupled
model's responses go out as the model sends them, interleaved with other requests' (as
Triton); each carries `triton_final_response`, true on its request's last, and a request whose
model ends with the final flag alone gets an empty final response only when it asked for one
(`triton_enable_empty_final_response`, tritonclient's enable_empty_final_response). Errors
name the request (id, model).

Bounds: at most `slots` requests of a stream are running or unsent (a slot is taken before a
request is read and given back with its last response), so a client that does not read stops
having its requests read; a decoupled request has one response here waiting to be sent and at
most its window waiting in its channel, beyond which its model's sender waits. The windows of
a stream's decoupled requests come from one budget (`STREAM_WINDOW` responses, each request
at least `MIN_WINDOW`): 128 requests each with a window of its own held 128 x 65 responses
for a client that read none (877 MB at 100 kB each). The stream's
deadline (grpc-timeout) ends the call with DEADLINE_EXCEEDED; when the call ends early
(cancelled, connection lost, deadline) every request still running is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from serval.batching.responses import DEFAULT_WINDOW
from serval.dataplane import DataPlane
from serval.errors import ServalError
from serval.protocol.grpc import grpc_service_pb2 as pb
from serval.protocol.grpc.codec import decoded, encode_infer_response
from serval.protocol.grpc.status import GrpcStatus
from serval.server.grpc.errors import grpc_error, unexpected_grpc_error
from serval.server.streams import StreamedResponse, infer_stream, is_decoupled

Answer = pb.ModelStreamInferResponse
FINAL_RESPONSE = "triton_final_response"  # a stream answer's parameter: the request's last
EMPTY_FINAL = "triton_enable_empty_final_response"  # a request's: answer a bare final flag
# (message or None: nothing to send, last of its request, set once it is handed on)
Outgoing = tuple[Answer | None, bool, asyncio.Future[None] | None]
STREAM_WINDOW = 128  # responses a stream's decoupled requests may hold untaken, together
MIN_WINDOW = 2  # a request's own, whatever the others hold (1 would stall on every ack)


Stream = Callable[[Any, int], AsyncGenerator[StreamedResponse, None]]  # (request, window)


class StreamCall:
    """One ModelStreamInfer call: read requests, run each, hand on their answers.

    `ordered(request)` is a request's one answer (a model that is not decoupled, or an error),
    `decoupled(request)` says which a request is (a bool, or an awaitable when that takes a
    load), `stream(request, window)` runs a decoupled one (its window lent from the
    stream's budget).

    Every request of a stream passes here, so the bookkeeping is plain counters, a deque and
    single waiters rather than asyncio's Semaphore and Queue (pure Python, several calls each)."""

    def __init__(self, ordered: Callable[[Any], Awaitable[Answer]],
                 decoupled: Callable[[Any], bool | Awaitable[bool]], stream: Stream,
                 context: Any, slots: int) -> None:
        self._ordered, self._decoupled, self._run_stream = ordered, decoupled, stream
        self._context = context
        self._loop = asyncio.get_running_loop()
        time_remaining = getattr(context, "time_remaining", None)
        remaining_s = time_remaining() if time_remaining is not None else None
        self._ends: float | None = (  # the stream's deadline (loop time)
            None if remaining_s is None else self._loop.time() + remaining_s)
        self._free_slots = slots
        self._slot_freed: asyncio.Future[None] | None = None  # the reader waits for a slot
        self._outbox: deque[Outgoing | None] = deque()
        self._outbox_filled: asyncio.Future[None] | None = None  # answers() waits for one
        self._tasks: set[asyncio.Task[None]] = set()
        self._previous: asyncio.Future[None] | None = None  # the last ordered answer is out
        self._started = 0
        self._lent = 0  # of STREAM_WINDOW, to the decoupled requests running

    async def answers(self, requests: AsyncIterator[Any]) -> AsyncGenerator[Answer, None]:
        reader = asyncio.create_task(self._read(requests))
        reading, finished = True, 0
        outbox = self._outbox
        try:
            while reading or finished < self._started:
                if not outbox:
                    await self._filled()
                elif self._ends is not None and self._loop.time() >= self._ends:
                    await self._deadline_passed()
                item = outbox.popleft()
                if item is None:
                    reading = False
                    continue
                message, last, handed_on = item
                if message is not None:
                    yield message
                if handed_on is not None and not handed_on.done():
                    handed_on.set_result(None)
                if last:
                    finished += 1
                    self._free_slots += 1
                    waiter = self._slot_freed
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
        finally:
            reader.cancel()
            for task in list(self._tasks):  # the call ended early: stop what still runs
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    def _put(self, item: Outgoing | None) -> None:
        self._outbox.append(item)
        waiter = self._outbox_filled
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _filled(self) -> None:
        """Until the outbox has an answer, within the stream's deadline (set at its start)."""
        while not self._outbox:
            self._outbox_filled = waiter = self._loop.create_future()
            try:
                if self._ends is None:
                    await waiter
                    continue
                remaining_s = self._ends - self._loop.time()
                try:
                    await asyncio.wait_for(waiter, max(0.0, remaining_s))
                except TimeoutError:
                    await self._deadline_passed()
            finally:
                self._outbox_filled = None

    async def _deadline_passed(self) -> None:
        await self._context.abort(GrpcStatus.DEADLINE_EXCEEDED,
                                  "the stream's deadline passed; its requests are cancelled")
        raise AssertionError("unreachable: abort raises")

    async def _read(self, requests: AsyncIterator[Any]) -> None:
        """Start each request as it is read (a slot first: see the module's bounds)."""
        loop = self._loop
        try:
            while True:
                while not self._free_slots:  # given back with a request's last answer
                    self._slot_freed = loop.create_future()
                    try:
                        await self._slot_freed
                    finally:
                        self._slot_freed = None
                self._free_slots -= 1
                request = await anext(requests, None)
                if request is None:
                    break
                self._started += 1
                previous = self._previous
                self._previous = mine = loop.create_future()
                task = loop.create_task(self._answer(request, previous, mine))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            self._put(None)

    async def _answer(self, request: Any, previous: asyncio.Future[None] | None,
                      mine: asyncio.Future[None]) -> None:
        try:
            decoupled = self._decoupled(request)
            if not isinstance(decoupled, bool):  # not known without loading the model
                decoupled = await decoupled
            if decoupled:
                _after(previous, mine)  # ordered answers behind it need not wait for it
                await self._stream(request)
                return
            answer = await self._ordered(request)
            if previous is not None:
                await previous
            self._put((answer, True, None))
        except Exception as exc:  # a bug: answer INTERNAL, keep the stream going
            error = stream_error(request, unexpected_grpc_error(exc, "ModelStreamInfer")[1])
            self._put((_final(error), True, None))
        finally:
            _after(previous, mine)

    async def _stream(self, request: Any) -> None:
        """A decoupled request's responses, each handed on before the next is taken."""
        final = False
        window = max(MIN_WINDOW, min(DEFAULT_WINDOW, STREAM_WINDOW - self._lent))
        self._lent += window
        try:
            async with contextlib.aclosing(self._run_stream(request, window)) as stream:
                async for item in stream:
                    final = item.final
                    await self._hand_on(_stream_answer(request, item), final)
        except ServalError as exc:
            error = stream_error(request, grpc_error(exc, "ModelStreamInfer")[1])
            await self._hand_on(_final(error), True)
        except Exception as exc:
            error = stream_error(request, unexpected_grpc_error(exc, "ModelStreamInfer")[1])
            await self._hand_on(_final(error), True)
        else:
            if not final:  # cannot happen: a stream ends with its final response
                await self._hand_on(None, True)
        finally:
            self._lent -= window

    async def _hand_on(self, message: Answer | None, last: bool) -> None:
        handed_on = self._loop.create_future()
        self._put((message, last, handed_on))
        await handed_on


async def decoupled_stream(dataplane: DataPlane, request: Any, window: int = DEFAULT_WINDOW
                           ) -> AsyncGenerator[StreamedResponse, None]:
    """A decoupled request's responses through the data plane (StreamCall's `stream`), at most
    `window` of them untaken."""
    received_ns = time.perf_counter_ns()
    responses = infer_stream(dataplane, request.model_name, request.model_version or None,
                             await decoded(request), received_ns, window=window)
    async with contextlib.aclosing(responses):
        async for response in responses:
            yield response


async def model_is_decoupled(dataplane: DataPlane, request: Any) -> bool:
    return await is_decoupled(dataplane, request.model_name, request.model_version or None)


def _after(previous: asyncio.Future[None] | None, mine: asyncio.Future[None]) -> None:
    """`mine` is done once `previous` is (at once without one, or when it is done already:
    every ordered request's case, with no callback made)."""
    if previous is None or previous.done():
        if not mine.done():
            mine.set_result(None)
        return

    def done(_: object) -> None:
        if not mine.done():
            mine.set_result(None)

    previous.add_done_callback(done)


def _stream_answer(request: Any, item: StreamedResponse) -> Answer | None:
    """A decoupled response as Triton streams it; None for a bare final flag the client did
    not ask to see."""
    if item.error is not None:
        answer = stream_error(request, grpc_error(item.error, "ModelStreamInfer")[1])
    elif item.bare and not _wants_empty_final(request):
        return None
    else:
        answer = Answer(infer_response=encode_infer_response(item.response))
    answer.infer_response.parameters[FINAL_RESPONSE].bool_param = item.final
    return answer


def _wants_empty_final(request: Any) -> bool:
    parameter = request.parameters.get(EMPTY_FINAL)
    return parameter is not None and parameter.bool_param


def _final(answer: Answer) -> Answer:
    answer.infer_response.parameters[FINAL_RESPONSE].bool_param = True
    return answer


def stream_error(request: Any, message: str) -> Answer:
    return Answer(error_message=message, infer_response=pb.ModelInferResponse(
        id=request.id, model_name=request.model_name, model_version=request.model_version))
