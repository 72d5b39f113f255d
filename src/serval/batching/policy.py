"""Batch formation as pure functions of the queue and the clock (no asyncio, no engine)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from serval.protocol.types import TensorDict

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


def signature_of(inputs: TensorDict) -> Signature:
    """What must agree for requests to share a batch: names, dtypes, non-batch dims."""
    return tuple((name, a.dtype.str, a.shape[1:]) for name, a in sorted(inputs.items()))


def dispatch_delay_ns(
    queue: deque[PendingRequest], queued_rows: int, max_batch_rows: int, max_delay_ns: int,
    now_ns: int,
) -> int:
    """0 to run a batch now, else how long to wait for more requests (queue non-empty)."""
    if max_delay_ns <= 0 or queued_rows >= max_batch_rows:
        return 0
    waited_ns = now_ns - queue[0].enqueued_ns
    return max(0, max_delay_ns - waited_ns)


def take_batch(queue: deque[PendingRequest], max_batch_rows: int) -> list[PendingRequest]:
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
