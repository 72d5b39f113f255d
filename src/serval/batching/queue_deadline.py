"""Queued requests' deadlines, kept while no batch forms."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from serval.errors import DeadlineExceeded

# how often waiting requests' deadlines are looked at while any wait: a request stuck behind
# an engine that does not come back gets its answer at most this long after its deadline
SWEEP_S = 0.05


class Waiting(Protocol):
    """A queued request (batching.policy.PendingRequest) or sequence step
    (batching.sequence_policy.SequenceStep)."""

    future: asyncio.Future[Any]
    deadline_ns: int | None
    taken: bool  # it left the queue for a batch


class DeadlineSweep:
    """Fails a queued request when its deadline passes, even while no batch forms (an engine
    stuck on the batch ahead): batch formation alone would drop it only once the engine came
    back. One loop timer per batcher, armed while requests with deadlines wait (not one per
    request: a timer costs ~2% of a small gRPC call). A request already taken into a batch is
    left to finish (a queue timeout is Triton's queue policy; the client's own deadline ends
    its call at the transport). The timer only wakes the check; the injected clock decides
    whether the time is up."""

    __slots__ = ("_clock", "_handle", "_waiting")

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self._handle: asyncio.TimerHandle | None = None
        self._waiting: list[Waiting] = []

    def watch(self, pending: Waiting) -> None:
        """A request with a deadline has joined the queue."""
        self._waiting.append(pending)
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)

    def _sweep(self) -> None:
        self._handle = None
        now_ns, still = self._clock(), []
        for pending in self._waiting:
            if pending.taken or pending.future.done():
                continue
            assert pending.deadline_ns is not None
            if now_ns >= pending.deadline_ns:
                pending.future.set_exception(
                    DeadlineExceeded("the request's deadline passed while it was queued"))
            else:
                still.append(pending)
        self._waiting = still
        if still:
            self._handle = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._waiting.clear()
