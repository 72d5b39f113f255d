"""Priority levels: a request's level from its `priority`, each level's rule, and a leveled
queue that batch formation (take_batch, dispatch_delay_ns) reads as one queue, level 1 first;
under DELAY, a request past its timeout behind its level's others."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from serval.batching.policy import PendingRequest, dispatch_delay_ns, signature_of, take_batch
from serval.batching.priority import (
    LeveledQueue,
    QueueRule,
    level_rules,
    priority_level,
    queue_timeout,
)

pytestmark = pytest.mark.unit

Make = Callable[..., PendingRequest]


@pytest.fixture
def make() -> Iterator[Make]:
    loop = asyncio.new_event_loop()

    def make(level: int, rows: int = 1, kind: str = "a", enqueued_ns: int = 0,
             delay_at_ns: int | None = None) -> PendingRequest:
        inputs = {"x": np.zeros((rows, {"a": 3, "b": 5}[kind]), dtype=np.float32)}
        return PendingRequest(inputs, rows, signature_of(inputs), loop.create_future(),
                              enqueued_ns, level=level, delay_at_ns=delay_at_ns)

    yield make
    loop.close()


@pytest.mark.parametrize(("priority", "level"), [
    (1, 1), (3, 3), (None, 2), (0, 2), (4, 2), (-1, 2), (True, 2), ("1", 2), (2.0, 2)])
def test_a_requests_level_is_its_priority_else_the_default(priority: object,
                                                           level: int) -> None:
    assert priority_level(priority, 3, 2) == level
    assert priority_level(priority, 0, 1) == 1  # no levels: one queue


def test_levels_without_their_own_rule_take_the_default() -> None:
    default, first = QueueRule(10), QueueRule(2, 5_000_000, False)
    assert level_rules(3, default, {1: first}) == (first, default, default)
    assert level_rules(0, default, {}) == (default,)


def test_batches_take_earlier_levels_first_each_in_arrival_order(make: Make) -> None:
    queue = LeveledQueue(3)
    third, second_a, first, second_b = make(3), make(2), make(1), make(2)
    for request in (third, second_a, first, second_b):
        queue.append(request)
    assert queue[0] is first and len(queue) == 4
    assert take_batch(queue, 3) == [first, second_a, second_b]
    assert take_batch(queue, 3) == [third] and not queue


def test_requests_skipped_by_a_batch_keep_their_level_and_place(make: Make) -> None:
    queue = LeveledQueue(2)
    head, other_kind, same_kind, late = make(1), make(1, kind="b"), make(2), make(2, kind="b")
    for request in (head, other_kind, same_kind, late):
        queue.append(request)
    assert take_batch(queue, 4) == [head, same_kind]
    assert [queue.popleft(), queue.popleft()] == [other_kind, late]


def test_rows_ahead_count_only_the_level_and_the_earlier_ones(make: Make) -> None:
    queue = LeveledQueue(3)
    for level, rows in ((3, 8), (1, 2), (2, 4), (1, 1)):
        queue.append(make(level, rows))
    assert [queue.rows_through(level) for level in (1, 2, 3)] == [3, 7, 15]
    assert [queue.waiting(level) for level in (1, 2, 3)] == [2, 1, 1]
    queue.extendleft(reversed(take_batch(queue, 2)))  # taken and put back: unchanged
    assert [queue.rows_through(level) for level in (1, 2, 3)] == [3, 7, 15]


def test_the_delay_is_judged_on_the_first_levels_head(make: Make) -> None:
    queue = LeveledQueue(2)
    queue.append(make(2, enqueued_ns=0))
    queue.append(make(1, enqueued_ns=900))
    assert dispatch_delay_ns(queue, 2, 8, 1_000, now_ns=1_000) == 900
    with pytest.raises(IndexError):
        LeveledQueue(1)[0]


@pytest.mark.parametrize(("rule", "deadline", "expected"), [
    (QueueRule(), None, (None, None)),
    (QueueRule(), 900, (900, None)),
    (QueueRule(None, 50), None, (150, None)),  # the default from now (100)
    (QueueRule(None, 50), 900, (900, None)),  # a request's own, allowed
    (QueueRule(None, 50, allow_override=False), 900, (150, None)),
    (QueueRule(None, 50, delay=True), None, (None, 150)),  # DELAY: a point, no deadline
    (QueueRule(None, 50, delay=True), 900, (None, 900)),
    (QueueRule(delay=True), None, (None, None)),
])
def test_a_requests_timeout_is_a_deadline_or_under_delay_a_point_to_move_back(
        rule: QueueRule, deadline: int | None, expected: tuple[int | None, int | None]) -> None:
    assert queue_timeout(rule, deadline, 100) == expected


def test_requests_past_their_delay_point_wait_behind_their_levels_others(make: Make) -> None:
    queue = LeveledQueue(2)
    old, fresh, late_point, second = (make(1, delay_at_ns=10), make(1, delay_at_ns=500),
                                      make(1, delay_at_ns=20), make(2))
    for request in (old, fresh, late_point, second):
        queue.append(request)
    queue.delay_expired(100)  # only `old`, at the front, moves: `late_point` waits its turn
    assert old.delayed and not late_point.delayed and len(queue) == 4
    assert queue.waiting(1) == 3  # delayed requests count against the level's bound
    assert queue[0] is fresh
    assert take_batch(queue, 1) == [fresh]
    queue.delay_expired(100)  # now at the front, `late_point` moves behind `old`
    assert take_batch(queue, 4) == [old, late_point, second] and not queue


def test_a_delayed_request_skipped_by_a_batch_stays_delayed(make: Make) -> None:
    queue = LeveledQueue(1)
    other_kind, head = make(1, kind="b", delay_at_ns=0), make(1)
    queue.append(other_kind)
    queue.append(head)
    queue.delay_expired(1)
    assert take_batch(queue, 2) == [head]
    assert queue[0] is other_kind and other_kind.delayed
    queue.append(make(1))
    assert queue[0] is not other_kind  # a fresh request goes ahead of the delayed one
