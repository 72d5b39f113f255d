"""/metrics renders, shared and paced: a flood of scrapes cannot take the event loop.

Rendering runs on the event loop and its cost grows with the models that get series (about
45 us per model on this box: 4.6 ms for the default 100 and the summed rest). Scrapes that
arrive together share one render. When a render served more than one scrape (several
scrapers at once: a flood), the next starts no sooner than PACE times its duration after it
ended, so however many connections scrape, however fast, rendering takes at most
1 / (PACE + 1) of the loop. A lone scraper (a Prometheus, a person polling) is never held
back: its every scrape renders at once. No scrape is answered with figures older than itself.

The pacing rule is a pure function (`next_start`); PacedRenderer is its thin async shell on an
injected clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

PACE = 9.0  # a render's duration times this must pass before the next one starts


def next_start(last_end: float, last_took: float, shared: bool, pace: float = PACE) -> float:
    """When the next render may start (on the renderer's clock): at once after a render that
    served one scrape, PACE x its duration after one that served several."""
    return last_end + pace * last_took if shared else float("-inf")


class PacedRenderer:
    """Serves `render()`'s bytes to scrapes, renders shared and paced by `next_start`."""

    def __init__(self, render: Callable[[], bytes],
                 clock: Callable[[], float] = time.monotonic, pace: float = PACE) -> None:
        self._render = render
        self._clock = clock
        self._pace = pace
        self._last_end = float("-inf")
        self._last_took = 0.0
        self._shared = False  # the last render served several scrapes
        self._next: asyncio.Future[bytes] | None = None  # the render waiting for its start
        self._waiting = 0  # scrapes waiting for it
        self.renders = 0

    async def get(self) -> bytes:
        """Figures rendered after this call began."""
        if self._next is None:
            loop = asyncio.get_running_loop()
            self._next = loop.create_future()
            self._waiting = 0
            delay = next_start(self._last_end, self._last_took, self._shared,
                               self._pace) - self._clock()
            if delay > 0:
                loop.call_later(delay, self._start, self._next)
            else:  # next turn of the loop: scrapes that arrive with this one share it
                loop.call_soon(self._start, self._next)
        self._waiting += 1
        return await asyncio.shield(self._next)

    def _start(self, future: asyncio.Future[bytes]) -> None:
        self._next = None  # scrapes from now on wait for the render after this one
        self._shared = self._waiting > 1
        started = self._clock()
        try:
            body = self._render()
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a scrape that went away leaves no warning
            return
        finally:
            self._last_end = self._clock()
            self._last_took = self._last_end - started
            self.renders += 1
        future.set_result(body)
