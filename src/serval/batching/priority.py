"""Priority levels (Triton's dynamic_batching `priority_levels`) and queue timeouts, as pure
data structures.

Levels run from 1, the first served, to N. A request's level is its `priority` parameter,
or the default level where it gives none, 0 or more than N (as Triton). Each level keeps its
requests in arrival order under its own queue rule (size bound, default timeout, what a
timeout does); a batch takes every level 1 request it can before any of level 2, and so on.
Under a DELAY rule a request past its timeout is not refused: it moves behind the requests of
its level still within theirs (Triton's timeout_action DELAY). To batch formation
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
    `allow_override` is false; past it, refused, or with `delay` served after the others."""

    max_size: int | None = None
    default_timeout_ns: int = 0
    allow_override: bool = True
    delay: bool = False


def queue_rule(max_size: int | None, default_timeout_ms: float, allow_override: bool,
               delay: bool = False) -> QueueRule:
    """A queue policy as configured (timeout in ms) as the batcher applies it."""
    return QueueRule(max_size, int(default_timeout_ms * 1_000_000), allow_override, delay)


def queue_timeout(rule: QueueRule, deadline_ns: int | None, now_ns: int
                  ) -> tuple[int | None, int | None]:
    """(deadline, delay point) of a request queued now under `rule`. Its timeout is its own
    deadline where the rule lets it set one, else the rule's default from now; under DELAY
    that is when it moves behind the others, and it has no deadline."""
    timeout_ns = deadline_ns
    if rule.default_timeout_ns and (deadline_ns is None or not rule.allow_override):
        timeout_ns = now_ns + rule.default_timeout_ns
    return (None, timeout_ns) if rule.delay else (timeout_ns, None)


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
    """Waiting requests by level; as a queue: level 1 in arrival order, then its delayed
    requests (past their timeout under DELAY) in the order they were delayed, then level 2..."""

    __slots__ = ("_delayed", "_levels", "_rows")

    def __init__(self, levels: int) -> None:
        self._levels: list[deque[PendingRequest]] = [deque() for _ in range(levels)]
        self._delayed: list[deque[PendingRequest]] = [deque() for _ in range(levels)]
        self._rows = [0] * levels

    def __len__(self) -> int:
        return sum(len(level) for level in self._levels) + sum(map(len, self._delayed))

    def __bool__(self) -> bool:
        return any(self._levels) or any(self._delayed)

    def __getitem__(self, index: int) -> PendingRequest:
        if index != 0:
            raise IndexError("a leveled queue shows its head only")
        for level, delayed in zip(self._levels, self._delayed, strict=True):
            if level or delayed:
                return level[0] if level else delayed[0]
        raise IndexError("the queue is empty")

    def append(self, request: PendingRequest) -> None:
        self._levels[request.level - 1].append(request)
        self._rows[request.level - 1] += request.rows

    def popleft(self) -> PendingRequest:
        for index, (level, delayed) in enumerate(zip(self._levels, self._delayed,
                                                     strict=True)):
            if level or delayed:
                request = level.popleft() if level else delayed.popleft()
                self._rows[index] -= request.rows
                return request
        raise IndexError("the queue is empty")

    def extendleft(self, requests: Iterable[PendingRequest]) -> None:
        """Put requests back at the front of their levels (as deque.extendleft: each in
        turn, so pass them reversed to keep their order)."""
        for request in requests:
            queues = self._delayed if request.delayed else self._levels
            queues[request.level - 1].appendleft(request)
            self._rows[request.level - 1] += request.rows

    def delay_expired(self, now_ns: int) -> None:
        """Move each level's requests past their delay point, from the front, behind the
        level's others (a request whose point passes while others wait ahead of it moves
        when it reaches the front)."""
        for level, delayed in zip(self._levels, self._delayed, strict=True):
            while level and level[0].delay_at_ns is not None and now_ns >= level[0].delay_at_ns:
                request = level.popleft()
                request.delayed = True
                delayed.append(request)

    def waiting(self, level: int) -> int:
        """Requests waiting at one level, delayed ones included."""
        return len(self._levels[level - 1]) + len(self._delayed[level - 1])

    def rows_through(self, level: int) -> int:
        """Rows a request of `level` waits behind: its level's and every earlier one's."""
        return sum(self._rows[:level])
