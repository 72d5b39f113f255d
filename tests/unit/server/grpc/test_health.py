"""grpc.health.v1 Watch: one poller for every open Watch, waking them only on a change."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from serval.protocol.grpc import health_pb2 as pb
from serval.server.grpc import health
from serval.server.grpc.health import HealthServicer

pytestmark = pytest.mark.unit
SERVING, NOT_SERVING = pb.HealthCheckResponse.SERVING, pb.HealthCheckResponse.NOT_SERVING


class Readiness:
    """The part of DataPlane health reads: ready(), counted."""

    def __init__(self) -> None:
        self.is_ready, self.asked = True, 0

    def ready(self) -> bool:
        self.asked += 1
        return self.is_ready


async def _watch(servicer: HealthServicer, seen: list[Any]) -> None:
    async for reply in servicer.Watch(pb.HealthCheckRequest(), None):
        seen.append(reply.status)


def test_a_hundred_watches_cost_one_look_per_poll_and_hear_each_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "WATCH_POLL_S", 0.01)

    async def scenario() -> tuple[list[list[Any]], int, int]:
        readiness = Readiness()
        servicer = HealthServicer(readiness)  # type: ignore[arg-type]
        seen: list[list[Any]] = [[] for _ in range(100)]
        watches = [asyncio.create_task(_watch(servicer, s)) for s in seen]
        await asyncio.sleep(0.2)
        polls = readiness.asked
        readiness.is_ready = False
        while not all(len(s) == 2 for s in seen):
            await asyncio.sleep(0.01)
        servicer.stopping.set()
        await asyncio.wait_for(asyncio.gather(*watches), 5)
        return seen, polls, servicer._watchers

    seen, polls, left = asyncio.run(scenario())
    assert all(s == [SERVING, NOT_SERVING] for s in seen)
    assert polls <= 1 + 0.2 / 0.01 + 5  # the first look, then one per poll: not one per Watch
    assert left == 0


def test_a_watch_that_ends_alone_stops_the_poller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "WATCH_POLL_S", 0.01)

    async def scenario() -> bool:
        servicer = HealthServicer(Readiness())  # type: ignore[arg-type]
        seen: list[Any] = []
        watch = asyncio.create_task(_watch(servicer, seen))
        while not seen:
            await asyncio.sleep(0.01)
        watch.cancel()  # the client went away
        await asyncio.gather(watch, return_exceptions=True)
        for _ in range(100):
            if servicer._poller is None:
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(scenario())
