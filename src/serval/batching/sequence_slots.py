"""A full sequence table's queue (batching/sequencer.py): the STARTs that wait for a free slot,
first come first served, and the steps of each such sequence that queue behind its START (its
backlog). A START waits until its deadline, or the idle time when it has none, then gets 429;
`stop()` (the model retiring or closing) fails every waiting START at once with 503."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from serval.batching.sequence_policy import LiveSequence, SequenceFlags, SequenceId, SequenceTable
from serval.errors import InvalidInput, Overloaded, ServalError, ServerUnavailable

Clock = Callable[[], int]
UNLOADING = "the model is being unloaded"


class SlotQueue:
    """Admits steps to `table`; `on_left` runs whenever a step stops waiting for its slot (the
    consumer looks again, and a drain learns when none waits)."""

    def __init__(self, table: SequenceTable, clock: Clock, model: str,
                 on_left: Callable[[], None]) -> None:
        self._table, self._clock, self._model, self._on_left = table, clock, model, on_left
        self._waiters: list[asyncio.Future[None]] = []
        self._backlog: dict[SequenceId, asyncio.Future[LiveSequence]] = {}
        self.waiting = 0  # steps waiting for their sequence's slot
        self.stopped = False

    @property
    def waiting_starts(self) -> int:
        return len(self._waiters)

    async def admit(self, flags: SequenceFlags, deadline_ns: int | None) -> LiveSequence:
        """The step's live sequence. A new one without a free slot waits for one (its next
        steps queue behind it: the backlog), then 429."""
        backlog = self._backlog.get(flags.id)
        if backlog is not None and not flags.start:
            self.waiting += 1
            try:
                return await asyncio.shield(backlog)
            finally:
                self._left()
        live = len(self._table.live)
        try:  # a new sequence queues behind those waiting for a slot (the one it frees
            sequence = None if (  # expiring idle ones is theirs): else they starve
                flags.start and self._waiters and flags.id not in self._table.live
            ) else self._table.admit(flags, self._clock())
        except InvalidInput:
            if len(self._table.live) < live:  # a late step freed its idle sequence's slot
                self.wake_one()
            raise
        if sequence is not None:
            return sequence
        backlog = asyncio.get_running_loop().create_future()
        self._backlog[flags.id] = backlog
        self.waiting += 1
        try:
            sequence = await self._wait_for_slot(flags, deadline_ns)
        except (ServalError, asyncio.CancelledError) as exc:
            # the steps behind it fail too; a start its client gave up on started nothing
            backlog.set_exception(exc if isinstance(exc, ServalError) else InvalidInput(
                f"sequence {flags.id!r} of model '{self._model}' did not start: its "
                "first request (sequence_start) was cancelled while it waited for a slot; "
                "start it again"))
            backlog.exception()  # retrieved: a backlog nobody followed logs nothing
            raise
        finally:
            self._left()
            if self._backlog.get(flags.id) is backlog:
                del self._backlog[flags.id]
        backlog.set_result(sequence)
        return sequence

    def wake_one(self) -> None:
        """A slot was freed: the START that waited longest takes it."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
                return

    def stop(self) -> None:
        """Every START waiting for a slot fails now (503), and any that comes later."""
        self.stopped = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _left(self) -> None:
        self.waiting -= 1
        self._on_left()

    async def _wait_for_slot(self, flags: SequenceFlags, deadline_ns: int | None
                             ) -> LiveSequence:
        limit_ns = self._clock() + self._table.idle_ns
        if deadline_ns is not None:
            limit_ns = min(limit_ns, deadline_ns)
        while True:
            left_s = (limit_ns - self._clock()) / 1e9
            if self.stopped:
                raise ServerUnavailable(UNLOADING)
            if left_s <= 0:
                raise Overloaded(
                    f"model '{self._model}' has all {self._table.capacity} sequence slots "
                    "held by live sequences; retry when one ends",
                    retry_after_s=max(0.1, self._table.idle_ns / 1e9))
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, left_s)
            except TimeoutError:
                pass
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self.wake_one()  # woken for a slot it will not take: pass it on
                raise
            finally:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            if self.stopped:  # close() freed every slot: taking one queued a step for ever
                raise ServerUnavailable(UNLOADING)
            sequence = self._table.admit(flags, self._clock())
            if sequence is not None:
                return sequence
