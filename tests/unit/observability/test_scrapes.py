"""/metrics renders shared and paced: a lone scraper renders at once, every time; scrapes that
overlap share renders, each starting after they arrived and, after a shared one, PACE x its
time after it ended."""

from __future__ import annotations

import asyncio
import time

import pytest

from serval.observability.scrapes import PACE, PacedRenderer, next_start

pytestmark = pytest.mark.unit

RENDER_S = 0.01


class _Render:
    """A render that takes RENDER_S and says which render it was; when each one started."""

    def __init__(self, fail_at: int = 0) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.fail_at = fail_at

    def __call__(self) -> bytes:
        self.starts.append(time.monotonic())
        time.sleep(RENDER_S)  # the render's own work: it runs on the loop, as generate_latest
        self.ends.append(time.monotonic())
        if len(self.starts) == self.fail_at:
            raise RuntimeError("collector failed")
        return b"%d" % len(self.starts)


def test_the_next_render_waits_pace_times_a_shared_ones_duration() -> None:
    assert next_start(10.0, 0.5, shared=True) == 10.0 + PACE * 0.5
    assert next_start(10.0, 0.5, shared=False) == float("-inf")  # one scraper: at once


def test_a_lone_scraper_renders_at_once_every_time() -> None:
    """A person or a test polling /metrics one scrape after another is never paced: on a clock
    where each render takes 1,000 s, a paced scrape would wait 9,000 s."""
    now = [0.0]

    def render() -> bytes:
        now[0] += 1000.0
        return b"%d" % (now[0] // 1000)

    renderer = PacedRenderer(render, clock=lambda: now[0])

    async def poll() -> list[bytes]:
        return await asyncio.wait_for(
            asyncio.gather(*[_after(renderer, i) for i in range(5)]), timeout=30)

    assert asyncio.run(poll()) == [b"1", b"2", b"3", b"4", b"5"]


async def _after(renderer: PacedRenderer, turn: int) -> bytes:
    """The scrape that goes out once `turn` others have been answered, one at a time."""
    while renderer.renders < turn:
        await asyncio.sleep(0)
    return await renderer.get()


def test_a_flood_of_scrapes_shares_paced_renders_each_newer_than_its_scrape() -> None:
    """Before: each of 200 scrapes rendered (200 renders back to back on the loop)."""
    render = _Render()
    renderer = PacedRenderer(render)

    async def flood() -> list[tuple[float, bytes]]:
        assert await renderer.get() == b"1"
        asked = []

        async def scrape() -> tuple[float, bytes]:
            asked_at = time.monotonic()
            return asked_at, await renderer.get()

        for _ in range(4):  # four waves of 50 concurrent scrapes, one after another
            asked += await asyncio.gather(*(scrape() for _ in range(50)))
        return asked

    answers = asyncio.run(flood())
    assert renderer.renders == 5  # the first, then one per wave
    for asked_at, body in answers:
        assert render.starts[int(body) - 1] >= asked_at  # never older than the scrape
    for index in range(2, 5):  # after each shared render (the first served one scrape)
        took = render.ends[index - 1] - render.starts[index - 1]
        assert render.starts[index] - render.ends[index - 1] >= PACE * took - 0.002


def test_a_failed_render_fails_its_scrapes_and_the_next_renders_again() -> None:
    renderer = PacedRenderer(_Render(fail_at=2))

    async def scrapes() -> list[object]:
        await renderer.get()
        failed = await asyncio.gather(renderer.get(), renderer.get(), return_exceptions=True)
        return [*failed, await renderer.get()]

    first, second, third = asyncio.run(scrapes())
    assert isinstance(first, RuntimeError) and isinstance(second, RuntimeError)
    assert third == b"3"
