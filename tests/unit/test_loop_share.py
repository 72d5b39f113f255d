"""The loop's ration for work over every model: a lone slice runs at once, a flood of slices
takes about SHARE of the time, first come first served."""

from __future__ import annotations

import asyncio
import time

import pytest

from serval.loop_share import LoopShare, refilled, wait_s

pytestmark = pytest.mark.unit

SLICE_S = 0.01


def test_the_bucket_refills_at_the_share_up_to_the_burst() -> None:
    assert refilled(-0.02, 10.0, 10.1, share=0.1, burst_s=0.05) == pytest.approx(-0.01)
    assert refilled(0.0, 10.0, 99.0, share=0.1, burst_s=0.05) == 0.05
    assert wait_s(-0.02, share=0.1) == pytest.approx(0.2)
    assert wait_s(0.01, share=0.1) == 0.0


def test_a_lone_slice_runs_at_once() -> None:
    share = LoopShare(share=0.1, burst_s=0.05)

    async def one() -> None:
        async with share.turn():
            time.sleep(SLICE_S)

    asyncio.run(one())
    assert share.waited == 0


def test_a_flood_of_slices_takes_about_the_share_in_arrival_order() -> None:
    """Before: 30 slices of 10 ms (statistics asked on 30 connections) ran back to back, the
    loop held for all of their 0.3 s."""
    share_of_loop, slices = 0.5, 30
    share = LoopShare(share=share_of_loop, burst_s=0.02)
    order: list[int] = []

    async def flood() -> float:
        async def one(index: int) -> None:
            async with share.turn():
                order.append(index)
                time.sleep(SLICE_S)

        started = time.monotonic()
        await asyncio.gather(*(one(index) for index in range(slices)))
        return time.monotonic() - started

    took = asyncio.run(flood())
    work = slices * SLICE_S
    # the burst runs at once; the rest at the share: at least (work - burst) / share in all
    assert took >= (work - 0.02) / share_of_loop * 0.95, took
    assert order == list(range(slices))
    assert share.waited > 0  # (a slice whose turn came late on a loaded box waits no more)
