"""MemoryKeeper: freezing after a load must not keep garbage cycles alive for good."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from serval.repository.memory import RECLAIM_INTERVAL_S, MemoryKeeper

pytestmark = pytest.mark.unit


class Node:
    """One half of a reference cycle (only the cyclic collector frees it)."""

    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_garbage_cycles_are_collected_before_a_load_freezes_the_heap() -> None:
    keeper = MemoryKeeper(clock=lambda: 0.0)
    gc.disable()
    try:
        garbage = cycle()  # unreachable already, not yet collected
        keeper.after_load()
    finally:
        gc.enable()
    assert garbage() is None


def test_a_cycle_frozen_while_alive_is_reclaimed_once_the_interval_passed() -> None:
    now = [0.0]
    keeper = MemoryKeeper(clock=lambda: now[0])
    live = Node()
    live.other = Node()
    live.other.other = live  # a connection open during a load, say
    ref = weakref.ref(live)
    keeper.after_load()  # frozen with everything alive
    del live
    gc.collect()
    assert ref() is not None  # frozen: the collector does not see it
    now[0] = RECLAIM_INTERVAL_S / 2
    keeper.after_load()
    assert ref() is not None  # not yet: full passes are rationed
    now[0] = RECLAIM_INTERVAL_S + 0.1
    keeper.after_load()
    assert ref() is None
    assert gc.get_freeze_count() > 0  # and the live heap is frozen again
