"""A decoupled model's responses to one request: a bounded channel from the model's threads
to the event loop, and the stream of them through the model's runner.

The channel holds at most `window` responses the client has not taken: a model thread that
sends more waits (backpressure reaches the model, never memory). When the client goes away
the request is cancelled: a waiting sender wakes, what it sends after is dropped, and the
model sees is_cancelled() turn true.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Callable

from serval.backends.base import ModelResponse, Runner, StreamRequest
from serval.errors import BackendError, ServalError
from serval.protocol.types import InferRequest, TensorDict

DEFAULT_WINDOW = 64  # responses of one request sent and not yet taken by its client


class ResponseChannel:
    """One request's responses (backends.base.ResponseSink): send from any thread, take on
    the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, window: int = DEFAULT_WINDOW) -> None:
        self.window = max(1, window)
        self._loop = loop
        self._queue: asyncio.Queue[ModelResponse] = asyncio.Queue()
        self._room = threading.Condition()
        self._untaken = 0
        self._cancelled = False
        self._ended = False  # the final response went in: nothing more goes
        self._on_taken: Callable[[], None] | None = None
        self._on_cancelled: Callable[[], None] | None = None
        self._owed_takes = 0  # taken before a relay was in place: told to it when it comes

    def send(self, response: ModelResponse) -> bool:
        """Queue a response, waiting while `window` are untaken; False when dropped (the
        request is cancelled, or it had its final response)."""
        with self._room:
            while self._untaken >= self.window and not self._cancelled:
                self._room.wait()
            if not self._admit(response):
                return False
        self._deliver(response)
        return True

    def forward(self, response: ModelResponse) -> None:
        """Queue without waiting (a relay that keeps the window itself)."""
        with self._room:
            if not self._admit(response):
                return
        self._deliver(response)

    def _admit(self, response: ModelResponse) -> bool:
        if self._cancelled or self._ended:
            return False
        self._untaken += 1
        self._ended = response.final
        return True

    def _deliver(self, response: ModelResponse) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
            self._loop.call_soon_threadsafe(self._queue.put_nowait, response)

    def relay(self, taken: Callable[[], None], cancelled: Callable[[], None]) -> None:
        """Tell `taken` of each response the client takes (those taken already included: a
        worker's first responses may come before its relay is in place), `cancelled` of the
        client going away."""
        with self._room:
            self._on_taken, self._on_cancelled = taken, cancelled
            owed, self._owed_takes = self._owed_takes, 0
        for _ in range(owed):
            taken()

    def is_cancelled(self) -> bool:
        return self._cancelled

    @property
    def ended(self) -> bool:
        return self._ended

    def cancel(self) -> None:
        """The client is gone: wake waiting senders, drop what comes after (once)."""
        with self._room:
            if self._cancelled:
                return
            self._cancelled = True
            self._room.notify_all()
        if self._on_cancelled is not None:
            self._on_cancelled()

    async def take(self) -> ModelResponse:
        response = await self._queue.get()
        with self._room:
            self._untaken -= 1
            self._room.notify()
            on_taken = self._on_taken
            if on_taken is None:
                self._owed_takes += 1
        if on_taken is not None:
            on_taken()
        return response


async def stream_responses(runner: Runner, inputs: TensorDict, deadline_ns: int | None,
                           request: InferRequest, window: int = DEFAULT_WINDOW
                           ) -> AsyncGenerator[ModelResponse, None]:
    """A decoupled model's responses to one request, as they come, until the final one.

    The request goes through the runner as any other (queued, dropped if its deadline passes
    there, admitted or refused); a failure before the model takes it, or of its execute(),
    ends the stream with that error. Closing the iterator early cancels the request."""
    channel = ResponseChannel(asyncio.get_running_loop(), window)
    stream_request = StreamRequest(request.inputs, request.outputs, request.id,
                                   request.parameters, request.binary_output, sink=channel,
                                   waiting_models=request.waiting_models)
    accepted = asyncio.ensure_future(runner.infer(inputs, deadline_ns, stream_request))
    accepted.add_done_callback(lambda task: _end_on_failure(task, channel))
    try:
        while True:
            response = await channel.take()
            yield response
            if response.final:
                return
    finally:
        if not channel.ended:
            channel.cancel()
        if not accepted.done():
            accepted.cancel()


def _end_on_failure(task: asyncio.Future[TensorDict], channel: ResponseChannel) -> None:
    if task.cancelled() or task.exception() is None:
        return
    exc = task.exception()
    error = exc if isinstance(exc, ServalError) else BackendError(f"the model failed: {exc!r}")
    channel.forward(ModelResponse(error=error, final=True))
