"""A model's engine threads calling other models of the server (Triton's BLS): each call goes
onto the event loop's data plane (backends.base.ModelCaller) and the thread waits, watching
whether its model is unloading. A call to the calling model itself is refused: its instances
may all be busy waiting on the call (a deadlock). A call's timeout bounds the wait: past it the
caller gets DeadlineExceeded even while the called model still runs (it may never end)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import TypeVar

from serval.errors import (
    BackendError,
    DeadlineExceeded,
    DecoupledUnary,
    InvalidInput,
    ServalError,
    ServerUnavailable,
)
from serval.protocol.types import InferRequest, TensorDict
from serval.repository.routes import StepRouter

ABANDON_POLL_S = 0.05  # how often a waiting call looks whether it should stop waiting
STREAM_WINDOW = 16  # responses of a streamed call held for the calling thread
T = TypeVar("T")
Item = tuple[TensorDict | ServalError, bool]


class LoopCaller:
    """backends.base.ModelCaller for one model version's engine threads."""

    def __init__(self, loop: asyncio.AbstractEventLoop, steps: StepRouter, own: str,
                 on_call: Callable[[], bool] = lambda: True) -> None:
        self._loop, self._steps, self._own = loop, steps, own
        self._on_call = on_call  # run on the loop before a call, until it answers True
        self._told = False

    def __call__(self, model: str, version: str | None, request: InferRequest,
                 timeout_s: float | None, abandon: threading.Event) -> TensorDict:
        deadline_ns = self._check(model, timeout_s)
        future = asyncio.run_coroutine_threadsafe(
            self._steps.run(model, version, request, deadline_ns), self._loop)
        try:
            return _wait(future, (abandon,), deadline_ns).outputs
        except _Stopped:
            raise self._unloading() from None
        except _Expired:
            raise _late(model, timeout_s) from None
        except DecoupledUnary:
            raise InvalidInput(f"model '{model}' is decoupled (0..n responses per request): "
                               "call it with exec(decoupled=True)") from None

    def stream(self, model: str, version: str | None, request: InferRequest,
               timeout_s: float | None, abandon: threading.Event, cancelled: threading.Event
               ) -> Iterator[Item]:
        deadline_ns = self._check(model, timeout_s)
        steps = self._steps

        async def start() -> tuple[asyncio.Queue[Item], asyncio.Task[None]]:
            items: asyncio.Queue[Item] = asyncio.Queue(STREAM_WINDOW)
            return items, asyncio.ensure_future(_pump(
                steps.stream(model, version, request, deadline_ns), items))

        try:
            items, pump = _wait(asyncio.run_coroutine_threadsafe(start(), self._loop),
                                (abandon,))
        except _Stopped:
            raise self._unloading() from None
        try:
            while not cancelled.is_set():  # else the stream ends without its final response
                try:
                    taken = _wait(asyncio.run_coroutine_threadsafe(_take(items), self._loop),
                                  (abandon, cancelled), deadline_ns)
                except _Stopped:
                    if abandon.is_set():
                        raise self._unloading() from None
                    return
                except _Expired:
                    raise _late(model, timeout_s) from None
                yield from taken
                if taken[-1][1]:
                    return
        finally:
            self._loop.call_soon_threadsafe(pump.cancel)  # the model's request is cancelled

    def _check(self, model: str, timeout_s: float | None) -> int | None:
        """The call's deadline; InvalidInput for a call to the calling model. The loop is
        told of the call before it runs (callbacks run in order)."""
        if model == self._own:
            raise InvalidInput(f"model '{self._own}' cannot run inference on itself")
        if not self._told:
            self._loop.call_soon_threadsafe(self._tell)
        return None if timeout_s is None else time.perf_counter_ns() + int(timeout_s * 1e9)

    def _tell(self) -> None:
        self._told = self._told or self._on_call()

    def _unloading(self) -> ServerUnavailable:
        return ServerUnavailable(f"model '{self._own}' is being unloaded")


class _Stopped(Exception):
    """A stop was set while waiting (the future is cancelled)."""


class _Expired(Exception):
    """The call's deadline passed while waiting (the future is cancelled)."""


def _late(model: str, timeout_s: float | None) -> DeadlineExceeded:
    return DeadlineExceeded(f"model '{model}' did not answer within the call's timeout "
                            f"({(timeout_s or 0) * 1e6:.0f} us)")


def _wait(future: concurrent.futures.Future[T], stops: tuple[threading.Event, ...],
          deadline_ns: int | None = None) -> T:
    """The future's result; _Stopped once one of `stops` is set, _Expired once the
    deadline (perf_counter_ns) has passed."""
    while True:
        try:
            return future.result(ABANDON_POLL_S)
        except concurrent.futures.TimeoutError:
            if any(stop.is_set() for stop in stops):
                future.cancel()
                raise _Stopped from None
            if deadline_ns is not None and time.perf_counter_ns() >= deadline_ns:
                future.cancel()
                raise _Expired from None


async def _take(items: asyncio.Queue[Item]) -> list[Item]:
    """The next item and every one queued behind it: one trip onto the loop for them all."""
    taken = [await items.get()]
    while not items.empty() and not taken[-1][1]:
        taken.append(items.get_nowait())
    return taken


async def _pump(stream: AsyncGenerator[Item, None], items: asyncio.Queue[Item]) -> None:
    """The stream's items into the queue (held to its size: the model waits), a failure
    before the end as a final error; the stream closed however it ends (cancelled too)."""
    try:
        async with contextlib.aclosing(stream):
            async for item in stream:
                await items.put(item)
                if item[1]:
                    return
    except ServalError as exc:
        await items.put((exc, True))
    except Exception as exc:  # the calling model gets the generic text
        await items.put((BackendError(f"{type(exc).__name__}: {exc}"), True))
