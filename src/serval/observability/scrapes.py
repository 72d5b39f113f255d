"""/metrics renders, paced: a flood of scrapes cannot take the event loop.

Rendering runs on the event loop and its cost grows with the models that get series (about
0.6 ms per model on this box: 100 busy models, 57 ms). Each render starts at most PACE times
its predecessor's duration after that one ended, so however many connections scrape, however
fast, rendering takes at most 1 / (PACE + 1) of the loop. No scrape is answered with figures
older than itself: a scrape that arrives within the pace waits for the next render, which
every scrape waiting then shares. A lone scrape renders at once, as before.

The pacing rule is a pure function (`next_start`); PacedRenderer is its thin async shell on an
injected clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

PACE = 9.0  # a render's duration times this must pass before the next one starts


def next_start(last_end: float, last_took: float, pace: float = PACE) -> float:
    """When the next render may start (on the renderer's clock)."""
    return last_end + pace * last_took


class PacedRenderer:
    """Serves `render()`'s bytes to scrapes, renders paced by `next_start`."""

    def __init__(self, render: Callable[[], bytes],
                 clock: Callable[[], float] = time.monotonic, pace: float = PACE) -> None:
        self._render = render
        self._clock = clock
        self._pace = pace
        self._last_end = float("-inf")
        self._last_took = 0.0
        self._next: asyncio.Future[bytes] | None = None  # the render waiting for its start
        self.renders = 0

    async def get(self) -> bytes:
        """Figures rendered after this call began."""
        if self._next is None:
            delay = next_start(self._last_end, self._last_took, self._pace) - self._clock()
            if delay <= 0:
                return self._run()
            loop = asyncio.get_running_loop()
            self._next = loop.create_future()
            loop.call_later(delay, self._start, self._next)
        return await asyncio.shield(self._next)

    def _start(self, future: asyncio.Future[bytes]) -> None:
        self._next = None  # scrapes from now on wait for the render after this one
        try:
            body = self._run()
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a scrape that went away leaves no warning
            return
        future.set_result(body)

    def _run(self) -> bytes:
        started = self._clock()
        try:
            return self._render()
        finally:
            self._last_end = self._clock()
            self._last_took = self._last_end - started
            self.renders += 1
