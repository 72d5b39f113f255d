"""Sequence batching's pure logic: flags from request parameters, the slot table (admit,
release, idle expiry on an explicit clock), which steps form a batch, direct-strategy rows."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from serval.batching.policy import signature_of
from serval.batching.sequence_policy import (
    LiveSequence,
    SequenceFlags,
    SequenceStep,
    SequenceTable,
    batch_rows,
    pick_batch,
    queue_delay_left_ns,
    sequence_flags,
)
from serval.errors import InvalidInput

pytestmark = pytest.mark.unit

MS = 1_000_000


def test_flags_from_parameters() -> None:
    assert sequence_flags({"sequence_id": 5, "sequence_start": True}, "m") == SequenceFlags(
        5, True, False)
    assert sequence_flags({"sequence_id": "a", "sequence_end": True}, "m") == SequenceFlags(
        "a", False, True)


@pytest.mark.parametrize("parameters,words", [
    ({}, "needs a non-zero parameter 'sequence_id'"),
    ({"sequence_id": 0}, "non-zero"),
    ({"sequence_id": ""}, "non-zero"),
    ({"sequence_id": -3}, "unsigned 64-bit"),
    ({"sequence_id": 1.5}, "not float"),
    ({"sequence_id": 1, "sequence_start": 1}, "'sequence_start' must be a boolean"),
    ({"sequence_id": 1, "sequence_end": "yes"}, "'sequence_end' must be a boolean"),
])
def test_bad_flags_are_named(parameters: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        sequence_flags(parameters, "m")


def test_table_admits_starts_into_free_slots_and_refuses_strangers() -> None:
    table = SequenceTable(2, 100 * MS, "m")
    first = table.admit(SequenceFlags(1, start=True), 0)
    second = table.admit(SequenceFlags("b", start=True), 0)
    assert first is not None and second is not None
    assert (first.slot, second.slot) == (0, 1)
    assert table.admit(SequenceFlags(3, start=True), 0) is None  # all slots held
    assert table.admit(SequenceFlags(1), 5) is first and first.last_ns == 5
    with pytest.raises(InvalidInput, match="is not live: its first request must set"):
        table.admit(SequenceFlags(4), 0)
    table.release(first)
    third = table.admit(SequenceFlags(3, start=True), 0)
    assert third is not None and third.slot == 0


def test_idle_sequences_expire_and_late_steps_are_told_why() -> None:
    table = SequenceTable(1, 100 * MS, "m")
    sequence = table.admit(SequenceFlags(1, start=True), 0)
    assert sequence is not None
    assert table.next_expiry_ns() == 100 * MS
    assert table.expire(99 * MS) == []
    sequence.running = True  # a running sequence never expires
    assert table.expire(500 * MS) == []
    sequence.running = False
    assert table.expire(500 * MS) == [sequence]
    assert table.live == {} and table.next_expiry_ns() is None
    with pytest.raises(InvalidInput, match="ended after 100 ms idle"):
        table.admit(SequenceFlags(1), 600 * MS)
    assert table.admit(SequenceFlags(1, start=True), 600 * MS) is not None


def _live(sequence_id: int, slot: int, enqueued_ns: int, width: int = 1) -> LiveSequence:
    sequence = LiveSequence(sequence_id, slot, 0)
    inputs = {"x": np.zeros((1, width), np.float32)}
    future: asyncio.Future[Any] = asyncio.Future(loop=asyncio.new_event_loop())
    sequence.steps.append(SequenceStep(inputs, SequenceFlags(sequence_id), signature_of(inputs),
                                       future, enqueued_ns))
    return sequence


def test_direct_picks_by_slot_and_pads_empty_slots() -> None:
    ready = [_live(1, 3, 10), _live(2, 0, 30), _live(3, 5, 20, width=2)]
    picked = pick_batch(ready, "direct", 4)
    assert [s.id for s in picked] == [2, 1]  # slot 5 is the next bank; width 2 differs anyway
    rows = batch_rows(picked, "direct", 4)
    assert [None if s is None else s.id for s in rows] == [2, None, None, 1]


def test_oldest_picks_longest_waiting_packed() -> None:
    ready = [_live(1, 3, 30), _live(2, 0, 10), _live(3, 1, 20)]
    picked = pick_batch(ready, "oldest", 2)
    assert [s.id for s in picked] == [2, 3]
    assert batch_rows(picked, "oldest", 2) == picked


def test_queue_delay_waits_only_for_a_batch_not_full() -> None:
    ready = [_live(1, 0, 10 * MS)]
    assert queue_delay_left_ns(ready, 4, 5 * MS, 12 * MS) == 3 * MS
    assert queue_delay_left_ns(ready, 1, 5 * MS, 12 * MS) == 0
    assert queue_delay_left_ns(ready, 4, 0, 12 * MS) == 0
