"""The per-model queue task: forms batches adaptively and runs them on engine threads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from serval.backends.base import LoadedModel, RequestModel
from serval.batching.policy import (
    PendingRequest,
    RequestQueue,
    ServiceTimes,
    batch_limit,
    batch_ns,
    dispatch_delay_ns,
    expected_wait_ns,
    is_live,
    merged_rows,
    record_batch,
    refusal_retry_after_s,
    signature_of,
    take_batch,
)
from serval.batching.priority import (
    LeveledQueue,
    QueueRule,
    level_rules,
    priority_level,
    queue_rule,
    queue_timeout,
)
from serval.batching.queue_deadline import DeadlineSweep
from serval.batching.tensors import concat_inputs, split_outputs
from serval.errors import (
    BackendError,
    DeadlineExceeded,
    EngineRejectedInput,
    Overloaded,
    ServalError,
    ServerUnavailable,
)
from serval.protocol.types import InferRequest, TensorDict
from serval.stats import ModelStats

log = logging.getLogger(__name__)

Clock = Callable[[], int]
# Admit only if the expected wait fits in 1/1.5 of the time left: the rest is for what the
# estimate leaves out (time in socket buffers and the event loop before the request is read,
# decoding, encoding and writing, estimate noise). At 2,000 clients with a 300 ms timeout,
# 1.25 left the accepted p99 at 328 ms seen by the client; 1.5 brought it to 212 ms.
ADMISSION_HEADROOM = 1.5


class Batcher:
    """One queue per model; `instances` consumer tasks each run one batch at a time.

    Engine calls run on `executor` (shared across models by the registry, so thousands of
    models do not mean thousands of threads), or on a pool of `instances` threads of its own.

    A consumer that finds the queue non-empty takes what is there at once (with
    max_queue_delay_ms 0), so an idle engine adds no delay and a busy one gathers
    everything that queued while it ran into the next batch.

    An engine that takes requests (backends.base.RequestModel, e.g. a Triton Python model)
    gets the batch as its list of requests, unmerged, and answers each one on its own.

    With `priority_levels` (batching/priority.py) requests wait by level, each level under
    its own rule (`priority_rules`, else the default: max_queue_size, default_timeout_ms,
    allow_timeout_override, delay_on_timeout), and batches take earlier levels first.
    """

    def __init__(
        self,
        model: LoadedModel,
        stats: ModelStats,
        *,
        instances: int = 1,
        max_queue_delay_ms: float = 0.0,
        max_queue_size: int | None = None,
        preferred_batch_sizes: tuple[int, ...] = (),
        default_timeout_ms: float = 0.0,
        allow_timeout_override: bool = True,
        delay_on_timeout: bool = False,
        priority_levels: int = 0,
        default_priority_level: int = 1,
        priority_rules: Mapping[int, QueueRule] | None = None,
        executor: ThreadPoolExecutor | None = None,
        clock: Clock = time.perf_counter_ns,
    ) -> None:
        self._model = model
        self._takes_requests = isinstance(model, RequestModel)
        self._stats = stats
        self._clock = clock
        max_batch = model.metadata.max_batch_size
        self._batching = max_batch > 0
        self._max_rows = max(1, max_batch)
        self._max_delay_ns = int(max_queue_delay_ms * 1_000_000)
        self._preferred = tuple(sorted(set(preferred_batch_sizes)))
        default_rule = queue_rule(max_queue_size, default_timeout_ms, allow_timeout_override,
                                  delay_on_timeout)
        self._levels, self._default_level = priority_levels, default_priority_level
        self._rules = level_rules(priority_levels, default_rule, priority_rules or {})
        self._delaying = any(rule.delay for rule in self._rules)
        self._leveled = (LeveledQueue(len(self._rules)) if priority_levels or self._delaying
                         else None)
        self._queue: RequestQueue = self._leveled if self._leveled is not None else deque()
        self._queued_rows = 0
        self._wakeup = asyncio.Event()
        self._deadlines = DeadlineSweep(clock)
        self._idle = asyncio.Event()
        self._idle.set()
        self._running = 0
        self._instances = instances
        self._times = ServiceTimes.empty()
        # per consumer: (when it became free for its running batch, that batch's expected ns)
        self._in_progress: list[tuple[int, float] | None] = [None] * instances
        self._closed = False
        self._owns_executor = executor is None
        self._executor = executor or ThreadPoolExecutor(
            instances, thread_name_prefix=f"engine-{stats.name}")
        self._consumers = [asyncio.create_task(self._consume(index))
                           for index in range(instances)]

    @property
    def queued(self) -> int:
        """Requests waiting for a batch (not counting the ones the engine is running)."""
        return len(self._queue)

    @property
    def running(self) -> int:
        """Batches the engine is computing right now."""
        return self._running

    async def infer(self, inputs: TensorDict, deadline_ns: int | None = None,
                    request: InferRequest | None = None) -> TensorDict:
        """Queue one request and wait for its own rows of the batch output (Overloaded at once
        if its deadline could not be met: see check_capacity). `request` is what an engine
        that takes requests sees of the client's request (None: the inputs alone)."""
        if self._closed:
            raise ServerUnavailable("the model is being unloaded")
        level = 1 if not self._levels else priority_level(
            request.parameters.get("priority") if request else None, self._levels,
            self._default_level)
        deadline_ns, delay_at_ns = queue_timeout(self._rules[level - 1], deadline_ns,
                                                 self._clock())
        self.check_capacity(deadline_ns, level)
        rows = _batch_rows(inputs) if self._batching else 1
        future: asyncio.Future[TensorDict] = asyncio.get_running_loop().create_future()
        pending = PendingRequest(
            inputs, rows, signature_of(inputs), future, self._clock(), deadline_ns, request,
            level, delay_at_ns)
        self._queue.append(pending)
        self._queued_rows += rows
        self._idle.clear()
        self._wakeup.set()
        if deadline_ns is not None:
            self._deadlines.watch(pending)
        return await future

    def check_capacity(self, deadline_ns: int | None = None, level: int | None = None) -> None:
        """Overloaded (429) when the request's level holds max_queue_size requests, or when a
        request due by `deadline_ns` (this batcher's clock) could not be answered in time given
        the queue ahead of it and the measured batch times (see policy.expected_wait_ns).
        `level` None: not known yet (before decoding), judged as the first level's, and
        with priority levels no size bound is checked."""
        if self._leveled is None or not self._levels:
            self._check_size(len(self._queue), self._rules[0].max_size, "")
        elif level is not None:
            self._check_size(self._leveled.waiting(level), self._rules[level - 1].max_size,
                             f" at priority {level}")
        if deadline_ns is None:
            return
        now_ns = self._clock()
        if not self._queue and self._running < self._instances and deadline_ns > now_ns:
            # A free engine takes the request whatever its measure says: a batch that ran
            # long once (a model that hung, then went on) would otherwise be refused on every
            # short deadline for ever, since only an admitted batch measures it again.
            return
        wait_ns = self.expected_wait_ns(now_ns, level=level or 1)
        retry_after_s = refusal_retry_after_s(now_ns, deadline_ns, wait_ns, ADMISSION_HEADROOM)
        if retry_after_s:
            raise Overloaded(
                f"model '{self._stats.name}' cannot answer before the request's deadline: "
                f"{len(self._queue)} requests queued ahead, expected wait "
                f"{(wait_ns or 0) / 1e6:.0f} ms; retry in {retry_after_s:.1f} s",
                retry_after_s)

    def _check_size(self, waiting: int, limit: int | None, where: str) -> None:
        if limit is not None and waiting >= limit:
            raise Overloaded(f"model '{self._stats.name}' has {waiting} requests queued{where}, "
                             "its max_queue_size; retry shortly")

    def expected_wait_ns(self, now_ns: int, rows: int = 1, level: int = 1) -> float | None:
        """How long a request of `rows` (at priority `level`) queued now should wait for its
        answer (None: no batch measured yet)."""
        running_left = 0.0
        for entry in self._in_progress:
            if entry is not None:
                free_ns, expected_ns = entry
                running_left += max(0.0, expected_ns - (now_ns - free_ns))
        ahead = self._queued_rows if self._leveled is None else self._leveled.rows_through(level)
        return expected_wait_ns(self._times, ahead, rows, self._max_rows, self._instances,
                                running_left)

    async def drain(self) -> None:
        """Wait until every queued and running request has its answer."""
        while self._queue or self._running:
            self._idle.clear()
            await self._idle.wait()

    def retire(self) -> None:
        return None  # what is queued is answered while the version drains

    async def close(self) -> None:
        """Stop the consumers; requests still queued fail as unavailable."""
        self._closed = True
        self._deadlines.close()
        await stop_consumers(self._consumers)
        while self._queue:
            fail_unloaded(self._queue.popleft().future)
        self._queued_rows = 0
        if self._owns_executor:
            self._executor.shutdown(wait=True)

    async def _consume(self, index: int) -> None:
        free_ns = self._clock()  # since when this consumer could take a batch
        while True:
            if not self._queue:
                self._wakeup.clear()
                if not self._running:
                    self._idle.set()
                await self._wakeup.wait()
                free_ns = self._clock()
                continue
            if self._delaying and self._leveled is not None:
                self._leveled.delay_expired(self._clock())
            delay_ns = dispatch_delay_ns(
                self._queue, self._queued_rows, self._max_rows, self._max_delay_ns, self._clock(),
                self._preferred,
            )
            if delay_ns > 0:
                await self._wait_for_more(delay_ns)
                free_ns = self._clock()
                continue
            batch = self._take_live_batch()
            if batch:
                rows = merged_rows(batch)
                self._in_progress[index] = (free_ns, batch_ns(self._times, rows) or 0.0)
                self._running += 1
                try:
                    await self._run(batch)
                finally:
                    self._running -= 1
                    self._in_progress[index] = None
                done_ns = self._clock()
                record_batch(self._times, rows, done_ns - free_ns)
                free_ns = done_ns

    async def _wait_for_more(self, delay_ns: int) -> None:
        self._wakeup.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), delay_ns / 1e9)

    def _take_live_batch(self) -> list[PendingRequest]:
        limit = batch_limit(self._queued_rows, self._max_rows, self._preferred)
        batch = take_batch(self._queue, limit)
        self._queued_rows -= merged_rows(batch)
        now_ns = self._clock()
        live = []
        for request in batch:
            request.taken = True
            if is_live(request, now_ns):
                self._stats.record_queue(now_ns - request.enqueued_ns)
                live.append(request)
            elif not request.future.done():
                request.future.set_exception(
                    DeadlineExceeded("the request's deadline passed while it was queued")
                )
        return live

    async def _run(self, batch: list[PendingRequest]) -> None:
        if self._takes_requests:
            await self._run_requests(batch)
            return
        loop = asyncio.get_running_loop()
        started_ns = self._clock()
        try:
            inputs = concat_inputs([request.inputs for request in batch])
            merged_ns = self._clock()
            outputs = await loop.run_in_executor(self._executor, self._model.infer, inputs)
            computed_ns = self._clock()
            pieces = self._split(outputs, batch)
        except asyncio.CancelledError:
            _fail_all(batch, ServerUnavailable("the model was unloaded while running"), "")
            raise
        except EngineRejectedInput as exc:
            if len(batch) == 1:
                _fail_all(batch, exc, self._stats.name)
                return
            for request in batch:  # one request's bad values must not fail its batch-mates
                await self._run([request])
            return
        except Exception as exc:
            _fail_all(batch, exc, self._stats.name)
            return
        done_ns = self._clock()
        for request, piece in zip(batch, pieces, strict=True):
            if request.request is not None and request.request.trace is not None:
                request.request.trace.batched(request.enqueued_ns, started_ns, merged_ns,
                                              computed_ns, done_ns)
            if not request.future.done():
                request.future.set_result(piece)
        self._stats.record_execution(
            merged_rows(batch), len(batch),
            merged_ns - started_ns, computed_ns - merged_ns, done_ns - computed_ns,
        )

    async def _run_requests(self, batch: list[PendingRequest]) -> None:
        """The batch as its list of requests; each request's error fails that request only."""
        assert isinstance(self._model, RequestModel)
        loop = asyncio.get_running_loop()
        requests = [pending.request or InferRequest(pending.inputs) for pending in batch]
        started_ns = self._clock()
        try:
            results = await loop.run_in_executor(
                self._executor, self._model.infer_requests, requests)
            if len(results) != len(batch):
                raise BackendError(f"model '{self._stats.name}' answered {len(results)} of "
                                   f"a batch of {len(batch)} requests")
        except asyncio.CancelledError:
            _fail_all(batch, ServerUnavailable("the model was unloaded while running"), "")
            raise
        except Exception as exc:
            _fail_all(batch, exc, self._stats.name)
            return
        computed_ns = self._clock()
        for pending, result in zip(batch, results, strict=True):
            if pending.request is not None and pending.request.trace is not None:
                pending.request.trace.batched(pending.enqueued_ns, started_ns, started_ns,
                                              computed_ns, computed_ns)
            if pending.future.done():
                continue
            if isinstance(result, ServalError):
                pending.future.set_exception(result)
            else:
                pending.future.set_result(result)
        self._stats.record_execution(merged_rows(batch), len(batch), 0,
                                     computed_ns - started_ns, self._clock() - computed_ns)

    def _split(self, outputs: TensorDict, batch: list[PendingRequest]) -> list[TensorDict]:
        if not self._batching:  # no batch axis: the one request gets the whole output
            return [outputs]
        return split_outputs(outputs, [request.rows for request in batch], self._stats.name)


def _batch_rows(inputs: TensorDict) -> int:
    return int(next(iter(inputs.values())).shape[0])


def _fail_all(batch: list[PendingRequest], exc: Exception, model_name: str) -> None:
    if isinstance(exc, ServalError):
        error: ServalError = exc
    else:
        error = BackendError(f"model '{model_name}' failed to run the batch")
        error.__cause__ = exc
    for request in batch:
        if not request.future.done():
            request.future.set_exception(error)


async def stop_consumers(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel a model's consumer tasks and wait until each has stopped."""
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


def fail_unloaded(future: asyncio.Future[TensorDict]) -> None:
    """A request still waiting when its model goes away: 503, the model was unloaded."""
    if not future.done():
        future.set_exception(ServerUnavailable("the model was unloaded"))
