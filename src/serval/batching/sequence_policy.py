"""Sequence batching as pure logic (no asyncio, no clock of its own): a request's sequence
flags, the table of live sequences and their slots, which sequences' next steps form a batch
(direct: by slot, padded; oldest: oldest waiting first), and idle expiry."""

from __future__ import annotations

import asyncio
import heapq
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from serval.batching.policy import Signature
from serval.errors import InvalidInput
from serval.protocol.types import InferRequest, TensorDict

SequenceId = int | str
Strategy = Literal["direct", "oldest"]
_FORGOTTEN_IDS = 4096  # expired ids remembered, to tell a late request what happened
# A string id is kept while its sequence lives, remembered after it expires and echoed in
# errors: bounded, so neither holds more than a few MiB whatever clients send.
MAX_STRING_ID_BYTES = 1024


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    """A request's place in its sequence (request parameters sequence_id/_start/_end)."""

    id: SequenceId
    start: bool = False
    end: bool = False


@dataclass(slots=True)
class SequenceStep:
    """One request of a sequence waiting for its batch (one row)."""

    inputs: TensorDict
    flags: SequenceFlags
    signature: Signature
    future: asyncio.Future[TensorDict]
    enqueued_ns: int
    deadline_ns: int | None = None
    request: InferRequest | None = None  # the client's (an engine that takes requests sees it)
    taken: bool = False  # it left its sequence's queue for a batch


@dataclass(slots=True)
class LiveSequence:
    """A sequence holding a slot: its waiting steps, its implicit state, when it last moved."""

    id: SequenceId
    slot: int
    last_ns: int
    steps: deque[SequenceStep] = field(default_factory=deque)
    state: TensorDict | None = None  # None: the initial state
    running: bool = False


def sequence_flags(parameters: Mapping[str, Any], model: str) -> SequenceFlags:
    """The request's sequence_id, sequence_start and sequence_end; InvalidInput when the id is
    missing or 0/"" (a sequence model takes sequence requests only) or a value is mistyped."""
    raw_id = parameters.get("sequence_id")
    if raw_id is None or raw_id == 0 or raw_id == "":
        raise InvalidInput(f"model '{model}' is a sequence model: every request needs a "
                           "non-zero parameter 'sequence_id' (an unsigned integer or a string)")
    if type(raw_id) is int:
        if not 0 < raw_id < 2**64:
            raise InvalidInput(f"parameter 'sequence_id' {raw_id} must be an unsigned 64-bit "
                               "integer or a string")
    elif type(raw_id) is float:  # JSON reads an integer past 2**64 - 1 as a float
        raise InvalidInput("parameter 'sequence_id' must be an unsigned integer or a string, "
                           f"not float ({raw_id!r}): an integer id is 1 to {2**64 - 1}, "
                           "without fraction or exponent")
    elif not isinstance(raw_id, str):
        raise InvalidInput("parameter 'sequence_id' must be an unsigned integer or a string, "
                           f"not {type(raw_id).__name__}")
    elif len(raw_id) > MAX_STRING_ID_BYTES // 4 and (
            size := len(raw_id.encode("utf-8", "surrogatepass"))) > MAX_STRING_ID_BYTES:
        raise InvalidInput(f"parameter 'sequence_id' is a string of {size} bytes; a string "
                           f"id is at most {MAX_STRING_ID_BYTES} bytes (UTF-8)")
    flags = []
    for name in ("sequence_start", "sequence_end"):
        value = parameters.get(name, False)
        if type(value) is not bool:
            raise InvalidInput(f"parameter '{name}' must be a boolean (true or false)")
        flags.append(value)
    return SequenceFlags(raw_id, flags[0], flags[1])


class SequenceTable:
    """The live sequences of one model: at most `capacity` at once, each in its own slot
    (0..capacity-1); expired ids remembered (bounded) to explain late requests. What a batch
    or an expiry looks at is kept as it changes (those with steps waiting; the quiet ones by
    last activity), never found by a scan of every live sequence: 100k of them made each
    batch cost the event loop 24 ms."""

    def __init__(self, capacity: int, idle_ns: int, model: str) -> None:
        self.capacity, self.idle_ns, self.model = capacity, idle_ns, model
        self.live: dict[SequenceId, LiveSequence] = {}
        # free slots: those released (a heap) and those never used (from _unused up): the
        # lowest is min(heap) else _unused, found in O(log n) (max_candidate_sequences may
        # be millions; a list of every slot, sorted at each start, cost 340 us a start at 100k)
        self._released: list[int] = []
        self._unused = 0
        self._expired: OrderedDict[SequenceId, None] = OrderedDict()
        self._waiting: dict[SequenceId, LiveSequence] = {}  # with steps waiting
        # neither waiting nor running, least recently active first (last_ns only grows)
        self._quiet: OrderedDict[SequenceId, LiveSequence] = OrderedDict()

    def admit(self, flags: SequenceFlags, now_ns: int) -> LiveSequence | None:
        """The live sequence a step belongs to, a new one on START (None: no slot free);
        InvalidInput for a step of a sequence that never started, ended or expired."""
        sequence = self.live.get(flags.id)
        if sequence is not None and self._idle(sequence, now_ns):
            self._forget(sequence)
            sequence = None
        if sequence is not None:
            sequence.last_ns = now_ns
            if sequence.id in self._quiet:
                self._quiet.move_to_end(sequence.id)
            return sequence
        if not flags.start:
            if flags.id in self._expired:
                raise InvalidInput(
                    f"sequence {flags.id!r} of model '{self.model}' was ended after "
                    f"{self.idle_ns / 1e6:.0f} ms idle (max_sequence_idle); start it again "
                    "with sequence_start")
            raise InvalidInput(f"sequence {flags.id!r} of model '{self.model}' is not live: "
                               "its first request must set sequence_start")
        if self._released:
            slot = heapq.heappop(self._released)
        elif self._unused < self.capacity:
            slot, self._unused = self._unused, self._unused + 1
        else:
            return None
        sequence = LiveSequence(flags.id, slot, now_ns)
        self.live[flags.id] = sequence
        self._quiet[flags.id] = sequence
        self._expired.pop(flags.id, None)
        return sequence

    def queue(self, sequence: LiveSequence, step: SequenceStep) -> None:
        """A step joins its live sequence."""
        sequence.steps.append(step)
        self._quiet.pop(sequence.id, None)
        self._waiting[sequence.id] = sequence

    def take(self, sequence: LiveSequence) -> SequenceStep:
        """The sequence's next step, into a batch (the sequence runs: see settle)."""
        sequence.running = True
        step = sequence.steps.popleft()
        step.taken = True
        if not sequence.steps:
            self._waiting.pop(sequence.id, None)
        return step

    def settle(self, sequence: LiveSequence, now_ns: int) -> None:
        """The sequence's batch is done: quiet from now, unless steps wait or it ended."""
        sequence.running, sequence.last_ns = False, now_ns
        if self.live.get(sequence.id) is sequence and not sequence.steps:
            self._quiet.pop(sequence.id, None)
            self._quiet[sequence.id] = sequence

    def release(self, sequence: LiveSequence) -> None:
        """Free the sequence's slot and state (its end)."""
        if self.live.get(sequence.id) is sequence:
            del self.live[sequence.id]
            self._waiting.pop(sequence.id, None)
            self._quiet.pop(sequence.id, None)
            heapq.heappush(self._released, sequence.slot)

    def expire(self, now_ns: int) -> list[LiveSequence]:
        """Release the sequences idle past idle_ns (nothing waiting, nothing running)."""
        idle = []
        for sequence in self._quiet.values():  # least recently active first
            if now_ns - sequence.last_ns < self.idle_ns:
                break
            if self._idle(sequence, now_ns):
                idle.append(sequence)
        for sequence in idle:
            self._forget(sequence)
        return idle

    def _idle(self, sequence: LiveSequence, now_ns: int) -> bool:
        return (not sequence.steps and not sequence.running
                and now_ns - sequence.last_ns >= self.idle_ns)

    def _forget(self, sequence: LiveSequence) -> None:
        self.release(sequence)
        self._expired[sequence.id] = None
        if len(self._expired) > _FORGOTTEN_IDS:
            self._expired.popitem(last=False)

    def next_expiry_ns(self) -> int | None:
        """When the next idle sequence expires (None: none could)."""
        for sequence in self._quiet.values():
            if not sequence.steps and not sequence.running:
                return sequence.last_ns + self.idle_ns
        return None

    @property
    def waiting_steps(self) -> int:
        return sum(len(s.steps) for s in self._waiting.values())

    def ready(self) -> list[LiveSequence]:
        """Sequences whose next step could run now (waiting, not running)."""
        return [s for s in self._waiting.values() if s.steps and not s.running]


def pick_batch(ready: list[LiveSequence], strategy: Strategy, max_rows: int
               ) -> list[LiveSequence]:
    """The sequences whose next steps form one batch: at most `max_rows`, one step each, all of
    one signature (the first's). Direct: lowest slots first; oldest: longest waiting first."""
    if not ready:
        return []
    if strategy == "direct":  # slots are banks of max_rows (one per instance)
        ordered = sorted(ready, key=lambda s: s.slot)
        bank = ordered[0].slot // max_rows
        ordered = [s for s in ordered if s.slot // max_rows == bank]
    else:
        ordered = sorted(ready, key=lambda s: s.steps[0].enqueued_ns)
    signature = ordered[0].steps[0].signature
    return [s for s in ordered if s.steps[0].signature == signature][:max_rows]


def batch_rows(picked: list[LiveSequence], strategy: Strategy, max_rows: int
               ) -> list[LiveSequence | None]:
    """Each batch row's sequence: direct puts a slot at its own row (slot mod max_rows; None:
    an empty slot, READY false, up to the highest slot picked); oldest packs them."""
    if strategy == "oldest":
        return list(picked)
    by_row = {s.slot % max_rows: s for s in picked}
    return [by_row.get(row) for row in range(max(by_row) + 1)]


def queue_delay_left_ns(picked: list[LiveSequence], max_rows: int, max_delay_ns: int,
                        now_ns: int) -> int:
    """How much longer to wait for more steps before running a batch not yet full."""
    if not picked or len(picked) >= max_rows or max_delay_ns <= 0:
        return 0
    oldest_ns = min(s.steps[0].enqueued_ns for s in picked)
    return max(0, oldest_ns + max_delay_ns - now_ns)
