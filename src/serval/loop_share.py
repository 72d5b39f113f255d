"""The event loop's time for work that grows with the model count, rationed.

Statistics of every model, the repository index and the status page's lists each cost the
loop in proportion to the models (150 busy models: a few ms; 10,000: 0.1 s and more), and any
client may ask for them again and again on many connections: 16 connections asking for every
model's statistics left 4 inferring clients 6% of their throughput. Such work runs in slices
charged to a bucket of loop time that refills at SHARE of real time and holds at most BURST_S:
a lone call, or a burst up to BURST_S, runs at once; beyond it each slice waits until the
bucket is out of debt, first come first served, so however many ask, that work takes about
SHARE of the loop and the requests behind it keep their latency. (/metrics renders are paced
and shared on their own: observability/scrapes.py.)

The bucket is pure functions (`refilled`, `wait_s`); LoopShare is their thin async shell on an
injected clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

SHARE = 0.1  # of the loop's time, for such work when it is asked for without pause
BURST_S = 0.05  # of loop time such work may take at once after a pause


def refilled(tokens: float, since: float, now: float, share: float = SHARE,
             burst_s: float = BURST_S) -> float:
    """The bucket's seconds at `now`, holding `tokens` at `since` (negative: a debt)."""
    return min(burst_s, tokens + share * (now - since))


def wait_s(tokens: float, share: float = SHARE) -> float:
    """How long a slice waits before it may start: until the debt is repaid."""
    return max(0.0, -tokens / share)


class LoopShare:
    """One server's bucket; `async with share.turn():` around each synchronous slice."""

    def __init__(self, share: float = SHARE, burst_s: float = BURST_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._share, self._burst_s, self._clock = share, burst_s, clock
        self._tokens, self._at = burst_s, clock()
        self._turns = asyncio.Lock()  # slices that must wait, in arrival order
        self.waited = 0  # slices that waited (a flood, or one huge call)

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Wait until the bucket allows, then charge the slice run in the block."""
        if self._turns.locked() or self._balance() < 0:
            async with self._turns:
                delay = wait_s(self._balance(), self._share)
                if delay > 0:
                    self.waited += 1
                    await asyncio.sleep(delay)
        started = self._clock()
        try:
            yield
        finally:
            self._tokens = self._balance() - (self._clock() - started)

    def _balance(self) -> float:
        now = self._clock()
        self._tokens = refilled(self._tokens, self._at, now, self._share, self._burst_s)
        self._at = now
        return self._tokens
