"""An instance pool's choice of member: up before down, a busy sibling that is up before one
its crash loop holds, and when none is up the one due first."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from serval.backends.base import ModelMetadata
from serval.backends.isolated_pool import InstancePool
from serval.protocol.types import TensorDict

pytestmark = pytest.mark.unit


class Member:
    """A pool member whose worker state the test sets: held None (up) or seconds held."""

    def __init__(self, name: str, held: float | None = None) -> None:
        self.name, self.held = name, held
        self.gate: threading.Event | None = None  # set: the batch waits for it
        self.running = threading.Event()

    @property
    def metadata(self) -> ModelMetadata:
        raise AssertionError("not asked")

    def memory_bytes(self) -> int:
        return 0

    def unload(self) -> None:
        pass

    def held_s(self) -> float | None:
        return self.held

    def infer(self, inputs: TensorDict) -> TensorDict:
        self.running.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        return {"by": np.array([self.name])}


def _ran_on(pool: InstancePool[Member]) -> str:
    return str(pool.infer({})["by"][0])


def test_a_member_that_is_up_takes_the_batch_before_one_that_is_down() -> None:
    pool = InstancePool([Member("restarting", held=0.0), Member("held", held=5.0),
                         Member("up")])
    assert [_ran_on(pool) for _ in range(3)] == ["up"] * 3


def test_with_none_up_the_member_due_first_takes_it() -> None:
    pool = InstancePool([Member("later", held=5.0), Member("sooner", held=1.0)])
    assert _ran_on(pool) == "sooner"
    pool.members[1].held = 0.0  # may start now
    assert _ran_on(pool) == "sooner"


def test_a_busy_member_that_is_up_is_waited_for_rather_than_a_held_one() -> None:
    busy, held = Member("busy"), Member("held", held=10.0)
    busy.gate = threading.Event()
    pool = InstancePool([busy, held])
    results: list[str] = []
    first = threading.Thread(target=lambda: results.append(_ran_on(pool)))
    first.start()
    assert busy.running.wait(30)
    busy.running.clear()
    second = threading.Thread(target=lambda: results.append(_ran_on(pool)))
    second.start()
    second.join(0.2)
    assert second.is_alive() and not held.running.is_set()  # waiting for `busy`
    busy.gate.set()
    first.join(30)
    second.join(30)
    assert results == ["busy", "busy"]


def test_a_member_restarted_while_a_batch_waits_takes_it() -> None:
    busy, restarting = Member("busy"), Member("restarting", held=0.0)
    busy.gate = threading.Event()
    pool = InstancePool([busy, restarting])
    first = threading.Thread(target=pool.infer, args=({},))
    first.start()
    assert busy.running.wait(30)
    results: list[str] = []
    second = threading.Thread(target=lambda: results.append(_ran_on(pool)))
    second.start()
    restarting.held = None  # its worker came back: the waiting batch looks again
    second.join(30)
    busy.gate.set()
    first.join(30)
    assert results == ["restarting"]
