"""The one timer per connection: fires at least every period, at a nearer deadline, on demand."""

from __future__ import annotations

import asyncio
import math

from serval.server.http.timer import ConnectionTimer

PERIOD = 0.2


def test_the_timer_looks_every_period_and_keeps_a_deadline_between() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        fired: list[float] = []
        acted: list[float] = []
        deadline = [math.inf]

        def check(now: float) -> float | None:
            fired.append(now)
            if now >= deadline[0]:
                acted.append(now)
                deadline[0] = math.inf
            return deadline[0]

        started = loop.time()
        timer = ConnectionTimer(loop, PERIOD, check)
        while len(fired) < 1:  # nothing to time: it still looks once a period
            await asyncio.sleep(0.01)
        assert fired[0] - started >= PERIOD - 1e-3
        deadline[0] = fired[0] + 1.25 * PERIOD  # set after a look: kept, not rounded up
        while not acted:
            await asyncio.sleep(0.01)
        assert deadline[0] == math.inf and acted[0] - (fired[0] + 1.25 * PERIOD) < 0.5 * PERIOD
        looks = len(fired)
        timer.fire_by(loop.time() + 0.01)  # on demand (a lingering close)
        await asyncio.sleep(0.1)
        assert len(fired) == looks + 1
        timer.stop()
        await asyncio.sleep(1.5 * PERIOD)
        assert len(fired) == looks + 1

    asyncio.run(run())


def test_a_past_deadline_never_spins_and_none_stops_it() -> None:
    async def run() -> None:
        loop = asyncio.get_running_loop()
        fired: list[float] = []

        def check(now: float) -> float | None:
            fired.append(now)
            return None if len(fired) >= 3 else now - 1.0  # a deadline left in the past

        ConnectionTimer(loop, 0.05, check)
        await asyncio.sleep(0.12)
        assert len(fired) == 2  # once a period, not in a loop
        await asyncio.sleep(0.2)
        assert len(fired) == 3  # None: stopped

    asyncio.run(run())
