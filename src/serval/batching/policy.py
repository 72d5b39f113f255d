"""Batch formation as pure functions of the queue and the clock (no asyncio, no engine)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from serval.protocol.types import InferRequest, TensorDict

Signature = tuple[tuple[str, str, tuple[int, ...]], ...]


@dataclass(slots=True, eq=False)
class PendingRequest:
    """One request waiting in a model's queue."""

    inputs: TensorDict
    rows: int
    signature: Signature
    future: asyncio.Future[TensorDict]
    enqueued_ns: int
    deadline_ns: int | None = None
    request: InferRequest | None = None  # the client's request (engines that take requests)
    level: int = 1  # its priority level (batching/priority.py), 1 without levels
    delay_at_ns: int | None = None  # under a DELAY rule: when it moves behind the others
    delayed: bool = False  # it has (priority.LeveledQueue.delay_expired)
    taken: bool = False  # it left the queue for a batch


class RequestQueue(Protocol):
    """What batch formation needs of a queue: a deque, or priority.LeveledQueue."""

    def __len__(self) -> int: ...
    def __getitem__(self, index: int, /) -> PendingRequest: ...
    def append(self, request: PendingRequest, /) -> None: ...
    def popleft(self) -> PendingRequest: ...
    def extendleft(self, requests: Iterable[PendingRequest], /) -> None: ...


def signature_of(inputs: TensorDict) -> Signature:
    """What must agree for requests to share a batch: names, dtypes, non-batch dims."""
    return tuple((name, a.dtype.str, a.shape[1:]) for name, a in sorted(inputs.items()))


def dispatch_delay_ns(
    queue: RequestQueue, queued_rows: int, max_batch_rows: int, max_delay_ns: int,
    now_ns: int, preferred: tuple[int, ...] = (),
) -> int:
    """0 to run a batch now, else how long to wait for more requests (queue non-empty).

    A queue that can fill a preferred batch size (sorted ascending) runs at once, as Triton's
    dynamic batcher does.
    """
    if max_delay_ns <= 0 or queued_rows >= max_batch_rows:
        return 0
    if preferred and queued_rows >= preferred[0]:
        return 0
    waited_ns = now_ns - queue[0].enqueued_ns
    return max(0, max_delay_ns - waited_ns)


def batch_limit(queued_rows: int, max_batch_rows: int, preferred: tuple[int, ...] = ()) -> int:
    """Rows the next batch may take: the largest preferred size the queue fills, else the
    model's maximum (no preferred size within reach: everything there is, as Triton)."""
    reachable = [size for size in preferred if size <= min(queued_rows, max_batch_rows)]
    return max(reachable) if reachable else max_batch_rows


def take_batch(queue: RequestQueue, max_batch_rows: int) -> list[PendingRequest]:
    """Remove and return the head request plus later ones of its signature that fit.

    Requests of another signature keep their place in the queue; an empty batch
    never comes back from a non-empty queue (the head always fits: it was validated).
    """
    head = queue.popleft()
    batch, rows = [head], head.rows
    if rows >= max_batch_rows or not queue:
        return batch
    skipped: list[PendingRequest] = []
    while queue and rows < max_batch_rows:
        candidate = queue.popleft()
        if candidate.signature == head.signature and rows + candidate.rows <= max_batch_rows:
            batch.append(candidate)
            rows += candidate.rows
        else:
            skipped.append(candidate)
            if candidate.signature == head.signature:
                break  # the next request of this kind would overflow: keep order
    queue.extendleft(reversed(skipped))
    return batch


def is_live(request: PendingRequest, now_ns: int) -> bool:
    """False for requests whose caller gave up or whose deadline passed."""
    if request.future.done():
        return False
    return request.deadline_ns is None or now_ns < request.deadline_ns


def merged_rows(batch: list[PendingRequest]) -> int:
    return sum(request.rows for request in batch)


# --- admission by expected wait ----------------------------------------------------------------

SIZE_CLASSES = 16  # batches of 1, 2, 3-4, 5-8, ... rows: one service-time estimate each
EWMA_ALPHA = 0.2


@dataclass(slots=True)
class ServiceTimes:
    """How long the engine takes per batch: an EWMA of nanoseconds and rows per size class.

    A batch's time is measured from the moment its consumer was free to take it (so the event
    loop's own delays under load count: they slow the queue down just as much).
    """

    ns: list[float]
    rows: list[float]

    @classmethod
    def empty(cls) -> ServiceTimes:
        return cls([0.0] * SIZE_CLASSES, [0.0] * SIZE_CLASSES)


def size_class(rows: int) -> int:
    return min(SIZE_CLASSES - 1, max(0, rows - 1).bit_length())


def record_batch(times: ServiceTimes, rows: int, ns: int, alpha: float = EWMA_ALPHA) -> None:
    """Fold one measured batch into its size class (the first one sets it)."""
    index = size_class(rows)
    if times.rows[index] == 0.0:
        times.ns[index], times.rows[index] = float(ns), float(rows)
    else:
        times.ns[index] += alpha * (ns - times.ns[index])
        times.rows[index] += alpha * (rows - times.rows[index])


def batch_ns(times: ServiceTimes, rows: int) -> float | None:
    """Expected time of a batch of `rows`: its own size class's measure, else a lower bound.

    An unmeasured size borrows the nearest measured class's time unscaled: a larger batch costs
    at least what a smaller one did, and a smaller one is taken to cost as much as the larger
    (its fixed overhead). Scaling up in proportion to the rows would call a batching engine
    64x slower at batch 64 than at batch 1 and refuse requests it would answer in time; the
    first full batch measures the real figure. None until any batch was measured.
    """
    index = size_class(rows)
    measured = times.rows
    if measured[index] > 0.0:
        return times.ns[index] * max(1.0, rows / measured[index])
    for distance in range(1, SIZE_CLASSES):
        for nearest in (index - distance, index + distance):
            if 0 <= nearest < SIZE_CLASSES and measured[nearest] > 0.0:
                return times.ns[nearest]
    return None


def expected_wait_ns(times: ServiceTimes, queued_rows: int, rows: int, max_batch_rows: int,
                     instances: int, running_left_ns: float) -> float | None:
    """How long until a request of `rows` arriving now has its answer.

    The rows queued ahead of it and its own go in full batches of max_batch_rows and one
    partial batch, after what the running batches still have to do; `instances` consumers
    share that work. None while nothing was measured (admit: no grounds to refuse).
    """
    full_batches, rest = divmod(queued_rows + rows, max_batch_rows)
    per_full = batch_ns(times, max_batch_rows)
    if per_full is None:
        return None
    partial = (batch_ns(times, rest) or 0.0) if rest else 0.0
    work = full_batches * per_full + partial
    return (running_left_ns + work) / max(1, instances)


def refusal_retry_after_s(now_ns: int, deadline_ns: int | None, wait_ns: float | None,
                          headroom: float = 1.0) -> float:
    """0.0 to admit; else seconds until the queue ahead should have drained enough.

    A request is refused when its expected wait (times `headroom`) would end past its deadline:
    queueing it would only make it, and those behind it, late.
    """
    if deadline_ns is None or wait_ns is None:
        return 0.0
    budget_ns = deadline_ns - now_ns
    excess_ns = wait_ns * headroom - budget_ns
    if excess_ns <= 0:
        return 0.0
    return excess_ns / 1e9
