"""A queued request's deadline, kept while no batch forms."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from serval.batching.policy import PendingRequest
from serval.errors import DeadlineExceeded

# a queued request's deadline is checked no more often than this (the loop's timer wakes it)
MIN_DEADLINE_CHECK_S = 0.001


class QueueDeadline:
    """Fails a queued request when its deadline passes, even while no batch forms (an engine
    stuck on the batch before it): batch formation alone would only drop it once the engine
    came back. A request already taken into a batch is left to finish (a queue timeout is
    Triton's queue policy; the client's own deadline ends its call at the transport). The
    loop's timer only wakes the check: the injected clock decides whether the time is up."""

    __slots__ = ("_clock", "_handle", "_pending")

    def __init__(self, pending: PendingRequest, clock: Callable[[], int]) -> None:
        self._pending, self._clock = pending, clock
        self._handle = self._arm()

    def _arm(self) -> asyncio.TimerHandle:
        assert self._pending.deadline_ns is not None
        left_s = (self._pending.deadline_ns - self._clock()) / 1e9
        return asyncio.get_running_loop().call_later(max(left_s, MIN_DEADLINE_CHECK_S),
                                                     self._check)

    def _check(self) -> None:
        pending = self._pending
        if pending.taken or pending.future.done():
            return
        assert pending.deadline_ns is not None
        if self._clock() < pending.deadline_ns:
            self._handle = self._arm()
            return
        pending.future.set_exception(
            DeadlineExceeded("the request's deadline passed while it was queued"))

    def cancel(self) -> None:
        self._handle.cancel()
