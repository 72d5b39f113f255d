"""One timer per connection for all its timeouts, re-armed only when it fires.

A connection's phases (headers arriving, body arriving, idle keep-alive, a peer that does not
read) each end at a deadline the connection derives from timestamps it keeps as it goes: plain
attribute stores on the data path, no timer calls. The timer fires at least every `period` (the
shortest timeout) and asks the connection for its next deadline: any phase begun since the timer
was armed ends at least `period` later, so no deadline is missed, and the timer is re-armed about
once per `period` however many requests the connection serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# check(now) acts on any deadline that has passed and returns the next one (math.inf: nothing
# to time now; look again within a period), or None once the connection is closed.
Check = Callable[[float], float | None]


class ConnectionTimer:
    __slots__ = ("_check", "_handle", "_loop", "_period")

    def __init__(self, loop: asyncio.AbstractEventLoop, period_s: float, check: Check) -> None:
        self._loop, self._period, self._check = loop, period_s, check
        self._handle: asyncio.TimerHandle | None = loop.call_at(loop.time() + period_s,
                                                                 self._fire)

    def fire_by(self, when: float) -> None:
        """Make sure the timer fires no later than `when` (a deadline shorter than a period)."""
        if self._handle is not None and self._handle.when() > when:
            self._handle.cancel()
            self._handle = self._loop.call_at(when, self._fire)

    def stop(self) -> None:
        """Cancel; drops the reference to the connection (no cycle through the loop)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        now = self._loop.time()
        deadline = self._check(now)
        if deadline is None or self._handle is not None:  # closed, or re-armed by check
            return
        # a deadline already past was acted on (or is the owner's bug): never spin on it
        when = deadline if now < deadline < now + self._period else now + self._period
        self._handle = self._loop.call_at(when, self._fire)
