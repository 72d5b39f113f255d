"""The sequence batcher: the async shell over batching/sequence_policy.py. Each request is one
step of a sequence (its sequence_id); steps of one sequence run in order, one row per sequence
per batch; the server fills the control inputs and carries the implicit state between steps.
An engine that takes requests (a Triton Python model) gets the batch as its list of requests,
one per sequence, each with its control and state inputs, as Triton hands them over."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TypeVar

from serval.backends.base import LoadedModel, RequestModel
from serval.batching.batcher import fail_unloaded, stop_consumers
from serval.batching.policy import signature_of
from serval.batching.queue_deadline import DeadlineSweep
from serval.batching.sequence_policy import (
    LiveSequence,
    SequenceId,
    SequenceStep,
    SequenceTable,
    batch_rows,
    pick_batch,
    queue_delay_left_ns,
    sequence_flags,
)
from serval.batching.sequence_slots import UNLOADING, SlotQueue
from serval.batching.sequence_tensors import (
    Row,
    check_corrid,
    control_tensors,
    initial_states,
    padded_inputs,
    row_states,
    state_inputs,
)
from serval.errors import (
    BackendError,
    DeadlineExceeded,
    EngineRejectedInput,
    InvalidInput,
    ServalError,
    ServerUnavailable,
)
from serval.model_config import SequenceBatchingConfig
from serval.protocol.types import InferRequest, TensorDict
from serval.stats import ModelStats

Clock = Callable[[], int]
Batch = TypeVar("Batch")  # what the engine takes: a batch's tensors, or its requests
Result = TypeVar("Result")
log = logging.getLogger(__name__)


class Sequencer:
    """One model's sequence batcher: `instances` consumer tasks, slots = max_batch_size per
    instance (direct) or max_candidate_sequences (oldest); a START beyond them waits for a
    free slot until its deadline, or the idle time when it has none, then gets 429."""

    def __init__(self, engine: LoadedModel, settings: SequenceBatchingConfig,
                 stats: ModelStats, *, instances: int = 1,
                 executor: ThreadPoolExecutor | None = None,
                 initial: TensorDict | None = None,
                 clock: Clock = time.perf_counter_ns) -> None:
        self._engine, self._settings, self._stats, self._clock = engine, settings, stats, clock
        self._initial = initial_states(settings, initial or {})
        self._takes_requests = isinstance(engine, RequestModel)
        self._state_outputs = tuple(state.output_name for state in settings.states)
        self._string_ids = any(control.kind == "corrid" and control.datatype == "BYTES"
                               for control in settings.controls)
        max_batch = engine.metadata.max_batch_size
        self._batched = max_batch > 0
        self._max_rows = max(1, max_batch)
        slots = self._max_rows * instances
        if settings.strategy == "oldest" and settings.max_candidate_sequences:
            slots = settings.max_candidate_sequences
        self._table = SequenceTable(slots, int(settings.max_sequence_idle_ms * 1e6), stats.name)
        self._delay_ns = int(settings.max_queue_delay_ms * 1e6)
        self._wakeup = asyncio.Event()
        self._settled = asyncio.Event()  # set while no step waits or runs
        self._settled.set()
        self._slots = SlotQueue(self._table, clock, stats.name, self._wakeup.set)
        self._deadlines = DeadlineSweep(clock)  # steps whose deadline passes while they wait
        self._running = 0
        self._closed = False
        self._owns_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(
            instances, thread_name_prefix=f"sequence-{stats.name}")
        self._consumers = [asyncio.create_task(self._consume()) for _ in range(instances)]

    @property
    def queued(self) -> int:
        """Steps waiting: in live sequences, and for a slot (a START and the steps behind it)."""
        return self._slots.waiting + self._table.waiting_steps

    @property
    def running(self) -> int:
        return self._running

    @property
    def live_sequences(self) -> int:
        return len(self._table.live)

    @property
    def waiting_starts(self) -> int:
        """New sequences waiting for a free slot."""
        return self._slots.waiting_starts

    def check_capacity(self, deadline_ns: int | None = None) -> None:
        """Nothing to refuse before decoding: a slot is judged by the request's sequence."""

    async def infer(self, inputs: TensorDict, deadline_ns: int | None = None,
                    request: InferRequest | None = None) -> TensorDict:
        """Run one step of the request's sequence; its outputs (state outputs hidden)."""
        if self._closed:
            raise ServerUnavailable(UNLOADING)
        flags = sequence_flags(request.parameters if request else {}, self._stats.name)
        check_corrid(self._settings, flags.id, self._stats.name)
        if self._string_ids and not isinstance(flags.id, str):  # the id the model is given:
            flags = replace(flags, id=str(flags.id))  # 5 and "5" are one sequence, not two
        if self._batched and any(a.shape[0] != 1 for a in inputs.values()):
            raise InvalidInput(f"model '{self._stats.name}' is a sequence model: each request "
                               "is one step of one sequence, batch size 1")
        if flags.start and len(self._table.live) >= self._table.capacity:
            self.expire_idle()  # a new sequence may find a slot an idle one held
        sequence = await self._slots.admit(flags, deadline_ns)
        if self._closed:  # closed while this step waited for its sequence's start
            raise ServerUnavailable(UNLOADING)
        future: asyncio.Future[TensorDict] = asyncio.get_running_loop().create_future()
        step = SequenceStep(inputs, flags, signature_of(inputs), future, self._clock(),
                            deadline_ns, request)
        self._table.queue(sequence, step)
        if deadline_ns is not None:
            self._deadlines.watch(step)
        self._settled.clear()
        self._wakeup.set()
        return await future

    def expire_idle(self) -> int:
        """Free the slots (and states) of sequences idle past max_sequence_idle; how many."""
        expired = self._table.expire(self._clock())
        for _ in expired:
            self._slots.wake_one()
        return len(expired)

    async def drain(self) -> None:
        """Wait until no step waits or runs (live sequences may stay)."""
        while self.queued or self._running:
            self._settled.clear()
            await self._settled.wait()

    def retire(self) -> None:
        """The model is going: STARTs waiting for a slot fail now (503), not after waiting out
        max_sequence_idle, which an unload waiting for in-flight requests would wait too;
        live sequences' steps still run until close()."""
        self._slots.stop()

    async def close(self) -> None:
        """Stop the consumers; waiting steps fail as unavailable; states are dropped."""
        self._closed = True
        self._deadlines.close()
        await stop_consumers(self._consumers)
        for sequence in list(self._table.live.values()):
            for step in sequence.steps:
                fail_unloaded(step.future)
            self._table.release(sequence)
        self._slots.stop()
        if self._owns_executor:
            self._executor.shutdown(wait=True)

    async def _consume(self) -> None:
        # not `while True`: on Python 3.11 a wait_for whose event is set as close() cancels
        # the task swallows the cancellation, and close() would wait for the task for ever
        while not self._closed:
            self.expire_idle()
            picked = pick_batch(self._table.ready(), self._settings.strategy, self._max_rows)
            delay_ns = queue_delay_left_ns(picked, self._max_rows, self._delay_ns,
                                           self._clock())
            if not picked and not self._running:
                self._settled.set()
            if not picked or delay_ns:
                await self._wait(delay_ns or self._until_expiry_ns())
                continue
            steps = [self._table.take(sequence) for sequence in picked]
            live = _unexpired(picked, steps, self._clock())
            self._running += 1
            try:  # whatever fails fails these steps, never this task (the model's every step
                if live:  # waits on it)
                    await self._run_steps([s for s, _ in live], [step for _, step in live])
            finally:
                self._running -= 1
                for sequence in picked:
                    self._table.settle(sequence, self._clock())
                if any(s.steps for s in picked):
                    self._wakeup.set()

    def _until_expiry_ns(self) -> int | None:
        expiry_ns = self._table.next_expiry_ns()
        return None if expiry_ns is None else max(1, expiry_ns - self._clock())

    async def _wait(self, timeout_ns: int | None) -> None:
        self._wakeup.clear()
        if timeout_ns is None:
            await self._wakeup.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout_ns / 1e9)

    async def _run_steps(self, picked: list[LiveSequence], steps: list[SequenceStep]) -> None:
        try:
            await self._run_batch(picked, steps)
        except asyncio.CancelledError:
            _fail(steps, ServerUnavailable("the model was unloaded while running"))
            raise
        except EngineRejectedInput as exc:
            if len(steps) == 1:
                _fail_steps(picked, steps, exc)
                return
            # one sequence's values must not fail the others' steps: each runs alone
            for sequence, step in zip(picked, steps, strict=True):
                await self._run_steps([sequence], [step])
        except ServalError as exc:
            _fail_steps(picked, steps, exc)
        except Exception:
            log.exception("model '%s': a sequence batch failed", self._stats.name)
            _fail_steps(picked, steps,
                        BackendError(f"model '{self._stats.name}' failed to run the batch"))

    async def _run_batch(self, picked: list[LiveSequence], steps: list[SequenceStep]) -> None:
        """Controls and states filled in; the engine's answer settles each step."""
        now_ns = self._clock()
        for step in steps:
            self._stats.record_queue(now_ns - step.enqueued_ns)
        by_id = {sequence.id: step for sequence, step in zip(picked, steps, strict=True)}
        rows = batch_rows(picked, self._settings.strategy, self._max_rows)
        filled = [None if s is None else Row(by_id[s.id].flags, s.state) for s in rows]
        server = control_tensors(self._settings.controls, filled, self._batched)
        server.update(state_inputs(self._settings, filled, self._batched, self._initial))
        if self._takes_requests:
            await self._run_requests(rows, by_id, server, now_ns)
            return
        inputs = padded_inputs([None if s is None else by_id[s.id].inputs for s in rows])
        inputs.update(server)
        merged_ns = self._clock()
        outputs = await self._compute(self._engine.infer, inputs)
        computed_ns = self._clock()
        for index, sequence in enumerate(rows):
            if sequence is not None:
                self._settle(sequence, by_id[sequence.id], outputs, index)
        self._stats.record_execution(len(rows), len(steps), merged_ns - now_ns,
                                     computed_ns - merged_ns, self._clock() - computed_ns)

    async def _run_requests(self, rows: list[LiveSequence | None],
                            by_id: dict[SequenceId, SequenceStep], server: TensorDict,
                            started_ns: int) -> None:
        """One batch for an engine that takes requests: each sequence's step its own request,
        with its row of the control and state inputs (no request for an empty slot)."""
        assert isinstance(self._engine, RequestModel)
        live = [(index, s) for index, s in enumerate(rows) if s is not None]
        requests = []
        for index, sequence in live:
            step = by_id[sequence.id]
            inputs = dict(step.inputs)
            inputs.update({name: array[index:index + 1] if self._batched else array
                           for name, array in server.items()})
            asked = step.request
            requests.append(InferRequest(
                inputs, id=asked.id if asked else None,
                parameters=asked.parameters if asked else {},
                waiting_models=asked.waiting_models if asked else frozenset()))
        steps = [by_id[sequence.id] for _, sequence in live]
        merged_ns = self._clock()
        results = await self._compute(self._engine.infer_requests, requests)
        if len(results) != len(requests):
            raise BackendError(f"model '{self._stats.name}' answered {len(results)} of a "
                               f"batch of {len(requests)} requests")
        computed_ns = self._clock()
        for (_, sequence), step, result in zip(live, steps, results, strict=True):
            missing = [] if isinstance(result, ServalError) else [
                name for name in self._state_outputs if name not in result]
            if missing:  # an engine's tensors have them all (checked at load); a model's may not
                result = BackendError(f"model '{self._stats.name}' returned no state output "
                                      f"'{missing[0]}'")
            try:
                if isinstance(result, ServalError):
                    raise result
                self._settle(sequence, step, result, 0)
            except ServalError as exc:
                _fail_steps([sequence], [step], exc)
        self._stats.record_execution(len(rows), len(steps), merged_ns - started_ns,
                                     computed_ns - merged_ns, self._clock() - computed_ns)

    async def _compute(self, call: Callable[[Batch], Result], batch: Batch) -> Result:
        """`call(batch)` on an engine thread; an engine's own failure is a BackendError."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, call, batch)
        except (ServalError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise BackendError(f"model '{self._stats.name}' failed to run the batch") from exc

    def _settle(self, sequence: LiveSequence, step: SequenceStep, outputs: TensorDict,
                index: int) -> None:
        """Row `index` of `outputs` answers the step; its state outputs are kept, hidden
        (BackendError, the state as it was, where one is not shaped as the config says)."""
        sequence.state = row_states(self._settings, outputs, index, self._batched,
                                    self._stats.name)
        if step.flags.end:
            self._end(sequence)
        if step.future.done():
            return
        step.future.set_result({
            name: array[index:index + 1] if self._batched else array
            for name, array in outputs.items() if name not in self._state_outputs})

    def _end(self, sequence: LiveSequence) -> None:
        """The sequence's last step ran: free its slot, unless its id starts again at once."""
        if sequence.steps and sequence.steps[0].flags.start:
            sequence.state = None
            return
        _fail(list(sequence.steps), InvalidInput(
            f"sequence {sequence.id!r} of model '{self._stats.name}' ended (sequence_end) "
            "before this request; start it again with sequence_start"))
        sequence.steps.clear()
        self._table.release(sequence)
        self._slots.wake_one()


def _fail_steps(picked: list[LiveSequence], steps: list[SequenceStep],
                error: ServalError) -> None:
    """Steps that did not run: their sequences' states stay as they were, but a START's is
    dropped: its client's next steps belong to the sequence it meant to start, never to one
    that id held before (they run from the initial state, as after a new id's failed START)."""
    for sequence, step in zip(picked, steps, strict=True):
        if step.flags.start:
            sequence.state = None
    _fail(steps, error)


def _fail(steps: list[SequenceStep], error: ServalError) -> None:
    for step in steps:
        if not step.future.done():
            step.future.set_exception(error)


def _unexpired(picked: list[LiveSequence], steps: list[SequenceStep], now_ns: int
               ) -> list[tuple[LiveSequence, SequenceStep]]:
    """The picked steps still due; one whose deadline passed while it waited is answered
    504 and not run (its sequence's state as _fail_steps leaves it), as the client was told."""
    live = []
    for sequence, step in zip(picked, steps, strict=True):
        if step.deadline_ns is None or now_ns < step.deadline_ns:
            live.append((sequence, step))
        else:
            _fail_steps([sequence], [step],
                        DeadlineExceeded("the request's deadline passed while it was queued"))
    return live
