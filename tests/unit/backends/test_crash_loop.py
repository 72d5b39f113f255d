"""The crash-loop backoff: a worker that keeps crashing restarts later and later, one that
crashes now and then at once; on an injected clock."""

from __future__ import annotations

import pytest

from serval.backends.crash_loop import CAP_S, FREE, STEADY_S, CrashLoop, restart_delay

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_the_first_crashes_restart_at_once_then_the_wait_doubles_to_its_cap() -> None:
    delays = [restart_delay(crashes) for crashes in range(1, 12)]
    assert delays == [0.0] * FREE + [1.0, 2.0, 4.0, 8.0, 16.0, CAP_S, CAP_S, CAP_S]
    assert restart_delay(10_000) == CAP_S  # no overflow however long it goes on


def test_a_worker_that_runs_steadily_starts_its_count_again() -> None:
    clock = Clock()
    loop = CrashLoop(clock)
    for _ in range(FREE):
        assert loop.crashed() == 0.0
        loop.started()
    assert loop.crashed() == 1.0 and loop.wait_s() == 1.0
    clock.now += 0.25
    assert loop.wait_s() == 0.75
    clock.now += 1.0
    assert loop.wait_s() == 0.0
    loop.started()
    clock.now += STEADY_S - 1
    assert loop.crashed() == 2.0  # still in a row: it ran less than STEADY_S
    clock.now += 2.0
    loop.started()
    clock.now += STEADY_S
    assert loop.crashed() == 0.0 and loop.crashes == 1


def test_a_crash_storm_costs_a_few_restarts_a_minute() -> None:
    """A client crashes the worker the moment it is back, for ten minutes: without the
    backoff that is a restart after each crash, with it about two a minute."""
    clock = Clock()
    loop = CrashLoop(clock)
    restarts, end = 0, clock.now + 600
    while clock.now < end:
        clock.now += 0.2 + loop.crashed()  # the restart itself takes 0.2 s
        loop.started()
        restarts += 1
    assert restarts <= FREE + 5 + 600 / CAP_S + 1
