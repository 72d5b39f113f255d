"""A worker process that keeps crashing is restarted later and later (Kubernetes'
CrashLoopBackOff).

A client that sends an input which crashes a model's worker, again and again, would otherwise
make the server start Python processes back to back, each one importing numpy and the model
(a core's worth of CPU for as long as the client goes on). A worker's first FREE crashes
restart it at once, so a model that crashes now and then never waits; past them each restart
waits FIRST_S, doubling up to CAP_S, and requests meanwhile get a 503 saying when it comes
back. The count starts again once a worker has run STEADY_S without crashing.

The rule is a pure function (`restart_delay`); CrashLoop keeps one worker's count on an
injected clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

FREE = 3  # crashes in a row that restart at once
FIRST_S = 1.0  # the first held restart's wait, doubled for each crash after it
CAP_S = 30.0  # the longest wait
STEADY_S = 60.0  # a worker that runs this long without crashing starts its count again


def restart_delay(crashes: int, free: int = FREE, first_s: float = FIRST_S,
                  cap_s: float = CAP_S) -> float:
    """Seconds before restarting a worker after the `crashes`-th crash in a row: none for the
    first `free`, then first_s, doubling, at most cap_s."""
    if crashes <= free:
        return 0.0
    return min(cap_s, first_s * 2.0 ** min(crashes - free - 1, 32))


class CrashLoop:
    """One worker's crashes in a row and when it may start again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 steady_s: float = STEADY_S) -> None:
        self._clock = clock
        self._steady_s = steady_s
        self._started = clock()
        self.crashes = 0  # in a row: each within steady_s of the (re)start before it
        self.restart_at = float("-inf")

    def started(self) -> None:
        """The worker (re)started now."""
        self._started = self._clock()

    def crashed(self) -> float:
        """The worker died now: the seconds its restart waits."""
        now = self._clock()
        if now - self._started >= self._steady_s:
            self.crashes = 0
        self.crashes += 1
        delay = restart_delay(self.crashes)
        self.restart_at = now + delay
        return delay

    def in_a_row(self) -> str:
        return f"has crashed {self.crashes} times in a row"

    def wait_s(self) -> float:
        """Seconds until the worker may restart (0: now)."""
        return max(0.0, self.restart_at - self._clock())
