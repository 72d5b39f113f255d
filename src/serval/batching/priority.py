"""Priority levels (Triton's dynamic_batching `priority_levels`), as pure data structures.

Levels run from 1, the first served, to N. A request's level is its `priority` parameter,
or the default level where it gives none, 0 or more than N (as Triton). Each level keeps its
requests in arrival order under its own queue rule (size bound, default timeout); a batch
takes every level 1 request it can before any of level 2, and so on. To batch formation
(policy.take_batch, dispatch_delay_ns) a LeveledQueue is one queue in that order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from serval.batching.policy import PendingRequest


@dataclass(frozen=True, slots=True)
class QueueRule:
    """One level's queue policy: at most `max_size` waiting (None: no bound), a request
    without a deadline given `default_timeout_ns` (0: none), or every request if
    `allow_override` is false."""

    max_size: int | None = None
    default_timeout_ns: int = 0
    allow_override: bool = True


def queue_rule(max_size: int | None, default_timeout_ms: float,
               allow_override: bool) -> QueueRule:
    """A queue policy as configured (timeout in ms) as the batcher applies it."""
    return QueueRule(max_size, int(default_timeout_ms * 1_000_000), allow_override)


def priority_level(priority: object, levels: int, default: int) -> int:
    """The level a request's `priority` parameter puts it at (1 without levels)."""
    if levels <= 0:
        return 1
    if type(priority) is int and 1 <= priority <= levels:
        return priority
    return default


def level_rules(levels: int, default: QueueRule, rules: Mapping[int, QueueRule]
                ) -> tuple[QueueRule, ...]:
    """Each level's rule (index level - 1): its own where given, else the default one."""
    return tuple(rules.get(level, default) for level in range(1, max(1, levels) + 1))


class LeveledQueue:
    """Waiting requests by level; as a queue: level 1 in arrival order, then level 2, ..."""

    __slots__ = ("_levels", "_rows")

    def __init__(self, levels: int) -> None:
        self._levels: list[deque[PendingRequest]] = [deque() for _ in range(levels)]
        self._rows = [0] * levels

    def __len__(self) -> int:
        return sum(len(level) for level in self._levels)

    def __bool__(self) -> bool:
        return any(self._levels)

    def __getitem__(self, index: int) -> PendingRequest:
        if index != 0:
            raise IndexError("a leveled queue shows its head only")
        for level in self._levels:
            if level:
                return level[0]
        raise IndexError("the queue is empty")

    def append(self, request: PendingRequest) -> None:
        self._levels[request.level - 1].append(request)
        self._rows[request.level - 1] += request.rows

    def popleft(self) -> PendingRequest:
        for index, level in enumerate(self._levels):
            if level:
                request = level.popleft()
                self._rows[index] -= request.rows
                return request
        raise IndexError("the queue is empty")

    def extendleft(self, requests: Iterable[PendingRequest]) -> None:
        """Put requests back at the front of their levels (as deque.extendleft: each in
        turn, so pass them reversed to keep their order)."""
        for request in requests:
            self._levels[request.level - 1].appendleft(request)
            self._rows[request.level - 1] += request.rows

    def waiting(self, level: int) -> int:
        """Requests waiting at one level."""
        return len(self._levels[level - 1])

    def rows_through(self, level: int) -> int:
        """Rows a request of `level` waits behind: its level's and every earlier one's."""
        return sum(self._rows[:level])
