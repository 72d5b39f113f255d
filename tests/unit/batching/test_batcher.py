"""The per-model Batcher over real ONNX Runtime sessions of tiny fixture models."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from serval.backends.base import LoadedModel, ModelMetadata, ModelVersionSpec
from serval.backends.onnxruntime import OnnxRuntimeBackend
from serval.backends.python import PythonBackend
from serval.batching.batcher import ADMISSION_HEADROOM, Batcher
from serval.batching.priority import QueueRule
from serval.errors import (
    BackendError,
    DeadlineExceeded,
    EngineRejectedInput,
    Overloaded,
    ServerUnavailable,
)
from serval.model_config import load_model_config
from serval.protocol.types import InferRequest, TensorDict
from serval.stats import ModelStats
from tests import fixture_models, triton_python_models

pytestmark = pytest.mark.unit


def load(repository: Path, build: Callable[..., Path], name: str) -> LoadedModel:
    build(repository, name=name)
    config = load_model_config(repository / name / "config.yaml")
    spec = ModelVersionSpec(name, "1", repository / name / "1", config)
    return OnnxRuntimeBackend(cores=1).load(spec)


class Gated:
    """A real model whose next run waits at a gate, so a test controls when the engine is busy.

    Every batch the engine actually runs is recorded; the gate closes again after each
    `hold()`, and stays open otherwise.
    """

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.batches: list[TensorDict] = []
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()

    @property
    def metadata(self) -> ModelMetadata:
        return self.model.metadata

    def hold(self) -> None:
        self.entered.clear()
        self.gate.clear()

    def open(self) -> None:
        self.gate.set()

    async def busy(self) -> None:
        """Wait until the engine has started the held run."""
        assert await asyncio.to_thread(self.entered.wait, 10), "the engine never started"

    def infer(self, inputs: TensorDict) -> TensorDict:
        self.batches.append({name: array.copy() for name, array in inputs.items()})
        self.entered.set()
        assert self.gate.wait(10), "the test never opened the gate"
        return self.model.infer(inputs)

    def memory_bytes(self) -> int:
        return self.model.memory_bytes()

    def unload(self) -> None:
        self.model.unload()

    def rows_seen(self, name: str) -> np.ndarray:
        return np.concatenate([batch[name] for batch in self.batches])


def features(seed: int, rows: int = 1, width: int = 8) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(tmp_path: Path) -> None:
    model = load(tmp_path, fixture_models.linear, "linear")
    session = ort.InferenceSession(str(tmp_path / "linear" / "1" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    inputs = [features(seed) for seed in range(32)]
    stats = ModelStats("linear", "1")

    async def main() -> list[TensorDict]:
        batcher = Batcher(model, stats)
        try:
            return await asyncio.gather(*(batcher.infer({"x": x}) for x in inputs))
        finally:
            await batcher.close()

    results = asyncio.run(main())
    for x, result in zip(inputs, results, strict=True):
        (expected,) = session.run(["probabilities"], {"x": x})
        assert result["probabilities"].shape == (1, 4)
        np.testing.assert_allclose(result["probabilities"], expected, rtol=1e-5, atol=1e-7)
    assert stats.inference_count == 32
    assert stats.execution_count < 32
    assert stats.queue.count == 32


def test_requests_of_several_rows_and_outputs_are_split_back(tmp_path: Path) -> None:
    model = Gated(load(tmp_path, fixture_models.add_sub, "add_sub"))
    rows = [1, 3, 2, 5, 1]
    inputs = [{"INPUT0": features(i, n, 16), "INPUT1": features(100 + i, n, 16)}
              for i, n in enumerate(rows)]
    stats = ModelStats("add_sub", "1")

    async def main() -> list[TensorDict]:
        batcher = Batcher(model, stats)
        try:
            model.hold()
            first = asyncio.create_task(batcher.infer(inputs[0]))
            await model.busy()
            rest = [asyncio.create_task(batcher.infer(i)) for i in inputs[1:]]
            await asyncio.sleep(0)
            model.open()
            return [await first, *await asyncio.gather(*rest)]
        finally:
            await batcher.close()

    results = asyncio.run(main())
    # The four requests queued behind the busy engine ran as one batch of 11 rows.
    assert [len(b["INPUT0"]) for b in model.batches] == [1, 11]
    for request, result in zip(inputs, results, strict=True):
        np.testing.assert_allclose(result["OUTPUT0"], request["INPUT0"] + request["INPUT1"])
        np.testing.assert_allclose(result["OUTPUT1"], request["INPUT0"] - request["INPUT1"])
    assert stats.inference_count == sum(rows)
    assert stats.execution_count == 2
    assert sorted(stats.batches) == [1, 11]


def test_past_deadline_fails_without_being_computed(tmp_path: Path) -> None:
    model = Gated(load(tmp_path, fixture_models.linear, "linear"))
    stats = ModelStats("linear", "1")
    now = [5_000]

    async def main() -> tuple[BaseException | None, TensorDict]:
        batcher = Batcher(model, stats, clock=lambda: now[0])
        try:
            late = None
            try:
                await batcher.infer({"x": features(1)}, deadline_ns=4_999)
            except DeadlineExceeded as exc:
                late = exc
            on_time = await batcher.infer({"x": features(2)}, deadline_ns=5_001)
            return late, on_time
        finally:
            await batcher.close()

    late, on_time = asyncio.run(main())
    assert isinstance(late, DeadlineExceeded)
    assert on_time["probabilities"].shape == (1, 4)
    np.testing.assert_array_equal(model.rows_seen("x"), features(2))
    assert stats.inference_count == 1


def test_deadline_passing_while_queued_behind_a_busy_engine(tmp_path: Path) -> None:
    model = Gated(load(tmp_path, fixture_models.linear, "linear"))
    stats = ModelStats("linear", "1")
    now = [1_000]

    async def main() -> tuple[TensorDict, BaseException | TensorDict]:
        batcher = Batcher(model, stats, clock=lambda: now[0])
        try:
            model.hold()
            first = asyncio.create_task(batcher.infer({"x": features(1)}))
            await model.busy()
            queued = asyncio.create_task(batcher.infer({"x": features(2)}, deadline_ns=2_000))
            await asyncio.sleep(0)
            now[0] = 2_000
            model.open()
            return await first, *await asyncio.gather(queued, return_exceptions=True)
        finally:
            await batcher.close()

    first, queued = asyncio.run(main())
    assert first["probabilities"].shape == (1, 4)
    assert isinstance(queued, DeadlineExceeded)
    np.testing.assert_array_equal(model.rows_seen("x"), features(1))
    assert stats.inference_count == 1


def test_a_queued_request_fails_at_its_deadline_while_the_engine_is_stuck(
        tmp_path: Path) -> None:
    """The engine never comes back from the batch ahead (a hung model): the queued request
    still gets its DeadlineExceeded when its time is up, not when a batch next forms."""
    model = Gated(load(tmp_path, fixture_models.linear, "linear"))
    stats = ModelStats("linear", "1")
    now = [1_000]

    async def main() -> BaseException | None:
        batcher = Batcher(model, stats, clock=lambda: now[0])
        model.hold()
        first = asyncio.create_task(batcher.infer({"x": features(1)}))
        await model.busy()
        queued = asyncio.create_task(batcher.infer({"x": features(2)}, deadline_ns=3_000))
        await asyncio.sleep(0.01)
        assert not queued.done()  # its time is not up: it waits
        now[0] = 3_000
        try:
            await asyncio.wait_for(queued, 10)  # the engine is still held
            return None
        except DeadlineExceeded as exc:
            return exc
        finally:
            model.open()
            await first
            await batcher.close()

    late = asyncio.run(main())
    assert isinstance(late, DeadlineExceeded) and "while it was queued" in late.message
    np.testing.assert_array_equal(model.rows_seen("x"), features(1))  # never computed


MS = 1_000_000


def test_a_deadline_the_queue_ahead_would_miss_is_refused_at_once(tmp_path: Path) -> None:
    """Measured batch times (injected clock) decide: 1 row took 30 ms, so a running batch 10 ms
    in has 20 ms left, and 3 queued + 1 new row are a 4-row batch that costs at least the 30 ms
    one row did (an unmeasured size is never priced above what was measured): 50 ms to wait."""
    model = Gated(load(tmp_path, fixture_models.linear, "linear"))
    stats = ModelStats("linear", "1")
    now = [0]

    async def main() -> tuple[float | None, Overloaded | None, Overloaded | None]:
        batcher = Batcher(model, stats, clock=lambda: now[0])
        try:
            batcher.check_capacity(deadline_ns=1)  # nothing measured yet: no grounds to refuse
            model.hold()
            first = asyncio.create_task(batcher.infer({"x": features(1)}))
            await model.busy()
            now[0] = 30 * MS
            model.open()
            await first  # one row measured at 30 ms
            model.hold()
            running = asyncio.create_task(batcher.infer({"x": features(2)}))
            await model.busy()
            queued = [asyncio.create_task(batcher.infer({"x": features(3 + i)}))
                      for i in range(3)]
            await asyncio.sleep(0)
            now[0] += 10 * MS
            wait = batcher.expected_wait_ns(now[0])
            fits = int(50 * MS * ADMISSION_HEADROOM)
            batcher.check_capacity(deadline_ns=now[0] + fits)  # 50 ms and the headroom
            refused = missed = None
            try:
                batcher.check_capacity(deadline_ns=now[0] + 40 * MS)
            except Overloaded as exc:
                refused = exc
            try:
                batcher.check_capacity(deadline_ns=now[0] - 1)
            except Overloaded as exc:
                missed = exc
            model.open()
            await asyncio.gather(running, *queued)
            return wait, refused, missed
        finally:
            await batcher.close()

    wait, refused, missed = asyncio.run(main())
    assert wait == pytest.approx(50 * MS)
    assert refused is not None and "cannot answer before the request's deadline" in refused.message
    assert refused.retry_after_s == pytest.approx(0.050 * ADMISSION_HEADROOM - 0.040)
    assert missed is not None
    assert missed.retry_after_s == pytest.approx(0.050 * ADMISSION_HEADROOM, abs=1e-6)
    assert len(model.batches) == 3  # nothing refused was queued


def test_an_idle_engine_admits_a_deadline_its_last_long_batch_would_refuse(
        tmp_path: Path) -> None:
    """One batch ran 500 ms (a model that hung, then went on). While the engine is idle a
    request due in 300 ms is admitted, so the next batch measures the engine again; while a
    batch runs, one due in 300 ms is refused as before."""
    model = Gated(load(tmp_path, fixture_models.linear, "linear"))
    stats = ModelStats("linear", "1")
    now = [0]

    async def main() -> Overloaded | None:
        batcher = Batcher(model, stats, clock=lambda: now[0])
        try:
            model.hold()
            first = asyncio.create_task(batcher.infer({"x": features(1)}))
            await model.busy()
            now[0] = 500 * MS
            model.open()
            await first  # one row measured at 500 ms
            batcher.check_capacity(deadline_ns=now[0] + 300 * MS)  # idle: admitted
            model.hold()
            running = asyncio.create_task(batcher.infer({"x": features(2)}))
            await model.busy()
            refused = None
            try:
                batcher.check_capacity(deadline_ns=now[0] + 300 * MS)
            except Overloaded as exc:
                refused = exc
            model.open()
            await running
            return refused
        finally:
            await batcher.close()

    refused = asyncio.run(main())
    assert refused is not None and "expected wait 1000 ms" in refused.message


def test_cancelled_request_is_dropped_before_compute(tmp_path: Path) -> None:
    model = Gated(load(tmp_path, fixture_models.linear, "linear"))
    stats = ModelStats("linear", "1")

    async def main() -> bool:
        batcher = Batcher(model, stats)
        try:
            model.hold()
            first = asyncio.create_task(batcher.infer({"x": features(1)}))
            await model.busy()
            abandoned = asyncio.create_task(batcher.infer({"x": features(2)}))
            await asyncio.sleep(0)
            assert batcher.queued == 1
            abandoned.cancel()
            model.open()
            await first
            await batcher.infer({"x": features(3)})
            return abandoned.cancelled()
        finally:
            await batcher.close()

    assert asyncio.run(main())
    np.testing.assert_array_equal(model.rows_seen("x"), np.concatenate([features(1), features(3)]))
    assert stats.inference_count == 2
    assert stats.execution_count == 2


def test_wrong_row_count_fails_the_whole_batch_and_the_batcher_goes_on(tmp_path: Path) -> None:
    model = Gated(load(tmp_path, fixture_models.first_row_only, "first_row"))
    stats = ModelStats("first_row", "1")
    rows = [features(seed, 1, 4) for seed in range(4)]

    async def main() -> list[Any]:
        batcher = Batcher(model, stats)
        try:
            model.hold()
            first = asyncio.create_task(batcher.infer({"X": rows[0]}))
            await model.busy()
            batch = [asyncio.create_task(batcher.infer({"X": x})) for x in rows[1:3]]
            await asyncio.sleep(0)
            model.open()
            outcomes = [await first, *await asyncio.gather(*batch, return_exceptions=True)]
            return [*outcomes, await batcher.infer({"X": rows[3]})]
        finally:
            await batcher.close()

    first, failed_a, failed_b, after = asyncio.run(main())
    np.testing.assert_array_equal(first["Y"], rows[0])
    for failure in (failed_a, failed_b):
        assert isinstance(failure, BackendError)
        assert "model 'first_row' returned 1 rows" in failure.message
        assert "batch of 2" in failure.message
    np.testing.assert_array_equal(after["Y"], rows[3])
    assert [len(b["X"]) for b in model.batches] == [1, 2, 1]
    assert stats.inference_count == 2 and stats.execution_count == 2


def test_engine_exception_becomes_backend_error_and_the_batcher_goes_on(tmp_path: Path) -> None:
    model = load(tmp_path, fixture_models.linear, "linear")
    stats = ModelStats("linear", "1")

    async def main() -> tuple[BaseException, TensorDict]:
        batcher = Batcher(model, stats)
        try:
            (failure,) = await asyncio.gather(
                batcher.infer({"not_x": features(1)}), return_exceptions=True
            )
            return failure, await batcher.infer({"x": features(2)})
        finally:
            await batcher.close()

    failure, result = asyncio.run(main())
    assert isinstance(failure, BackendError)
    assert "model 'linear' failed to run the batch" in failure.message
    assert failure.__cause__ is not None
    assert result["probabilities"].shape == (1, 4)
    assert stats.inference_count == 1


def run_unbatched(tmp_path: Path, count: int) -> tuple[Gated, ModelStats, list[Any], list[Any]]:
    """`count` concurrent requests to the max_batch_size 0 model, queued behind a busy engine."""
    model = Gated(load(tmp_path, fixture_models.fixed_shape, "fixed"))
    stats = ModelStats("fixed", "1")
    inputs = [features(seed, 2, 3) for seed in range(count)]

    async def main() -> list[Any]:
        batcher = Batcher(model, stats)
        try:
            model.hold()
            first = asyncio.create_task(batcher.infer({"X": inputs[0]}))
            await model.busy()
            rest = [asyncio.create_task(batcher.infer({"X": x})) for x in inputs[1:]]
            await asyncio.sleep(0)
            model.open()
            return await asyncio.gather(first, *rest, return_exceptions=True)
        finally:
            await batcher.close()

    return model, stats, inputs, asyncio.run(main())


def test_unbatched_model_runs_each_request_alone(tmp_path: Path) -> None:
    model, _, inputs, _ = run_unbatched(tmp_path, 4)
    assert len(model.batches) == 4
    for batch, x in zip(model.batches, inputs, strict=True):
        np.testing.assert_array_equal(batch["X"], x)


def test_unbatched_model_returns_each_request_its_result(tmp_path: Path) -> None:
    _, stats, inputs, results = run_unbatched(tmp_path, 3)
    for x, result in zip(inputs, results, strict=True):
        assert not isinstance(result, BaseException), result
        np.testing.assert_array_equal(result["Y"], x * 2)
    assert stats.execution_count == 3


def test_close_fails_queued_requests_and_refuses_new_ones(tmp_path: Path) -> None:
    model = Gated(load(tmp_path, fixture_models.linear, "linear"))
    stats = ModelStats("linear", "1")

    async def main() -> tuple[list[Any], BaseException | None]:
        batcher = Batcher(model, stats)
        model.hold()
        running = asyncio.create_task(batcher.infer({"x": features(1)}))
        await model.busy()
        queued = [asyncio.create_task(batcher.infer({"x": features(s)})) for s in (2, 3)]
        await asyncio.sleep(0)
        assert batcher.queued == 2
        model.open()
        await batcher.close()
        outcomes = await asyncio.gather(*queued, return_exceptions=True)
        running.cancel()
        refused = None
        try:
            await batcher.infer({"x": features(4)})
        except ServerUnavailable as exc:
            refused = exc
        return outcomes, refused

    outcomes, refused = asyncio.run(main())
    assert all(isinstance(o, ServerUnavailable) for o in outcomes), outcomes
    assert isinstance(refused, ServerUnavailable)
    np.testing.assert_array_equal(model.rows_seen("x"), features(1))


def test_close_answers_the_request_the_engine_is_running(tmp_path: Path) -> None:
    model = Gated(load(tmp_path, fixture_models.linear, "linear"))

    async def main() -> bool:
        batcher = Batcher(model, ModelStats("linear", "1"))
        model.hold()
        running = asyncio.create_task(batcher.infer({"x": features(1)}))
        await model.busy()
        model.open()
        await batcher.close()
        for _ in range(5):
            await asyncio.sleep(0)
        answered = running.done()
        running.cancel()
        return answered

    assert asyncio.run(main())


def _triton_model(folder: Path) -> Any:
    """A Triton Python model (it takes requests) loaded in this process."""
    config = load_model_config(folder / "config.yaml")
    return PythonBackend(allowed=True).load(ModelVersionSpec(folder.name, "1", folder / "1",
                                                             config))


def test_an_engine_that_takes_requests_gets_them_unmerged(tmp_path: Path) -> None:
    model = _triton_model(triton_python_models.add_sub(tmp_path))
    stats = ModelStats("add_sub", "1")
    inputs = [{"INPUT0": np.full((rows, 16), rows, np.int32),
               "INPUT1": np.ones((rows, 16), np.int32)} for rows in (1, 2, 3)]
    requests = [InferRequest(x, id=f"r{i}") for i, x in enumerate(inputs)]

    async def main() -> list[TensorDict]:
        batcher = Batcher(model, stats, max_queue_delay_ms=200)
        try:
            return await asyncio.gather(*(batcher.infer(r.inputs, None, r) for r in requests))
        finally:
            await batcher.close()

    results = asyncio.run(main())
    assert model._instance.batch_sizes == [3]  # one execute(), a list of three requests
    for x, result in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(result["OUTPUT0"], x["INPUT0"] + 1)
    assert stats.execution_count == 1 and stats.inference_count == 6


def test_a_request_error_from_such_an_engine_fails_that_request_alone(tmp_path: Path) -> None:
    folder = triton_python_models.write(tmp_path, "checked", triton_python_models.CHECKED,
                                        triton_python_models.CHECKED_CONFIG)
    model = _triton_model(folder)
    values = [1, -1, 2]

    async def main() -> list[Any]:
        batcher = Batcher(model, ModelStats("checked", "1"), max_queue_delay_ms=200)
        try:
            return await asyncio.gather(
                *(batcher.infer({"INPUT0": np.full((1, 2), v, np.int32)}) for v in values),
                return_exceptions=True)
        finally:
            await batcher.close()

    first, failed, last = asyncio.run(main())
    assert isinstance(failed, EngineRejectedInput) and "negative" in failed.message
    np.testing.assert_array_equal(first["OUTPUT0"], [[2, 2]])
    np.testing.assert_array_equal(last["OUTPUT0"], [[4, 4]])


def test_a_model_default_timeout_gives_requests_a_deadline(tmp_path: Path) -> None:
    """default_timeout_ms applies to requests without a deadline, and to every request when
    allow_timeout_override is false (Triton's default_queue_policy)."""
    model = Gated(load(tmp_path, fixture_models.linear, "linear"))
    now = [5_000]

    async def late(allow_override: bool, deadline_ns: int | None) -> bool:
        batcher = Batcher(model, ModelStats("linear", "1"), clock=lambda: now[0],
                          default_timeout_ms=0.001, allow_timeout_override=allow_override)
        model.hold()
        try:
            first = asyncio.ensure_future(batcher.infer({"x": features(1)}))
            await model.busy()
            queued = asyncio.ensure_future(batcher.infer({"x": features(2)}, deadline_ns))
            await asyncio.sleep(0)
            now[0] += 2_000  # past the 1 µs default, before the request's own deadline
            model.open()
            await first
            try:
                await queued
            except DeadlineExceeded:
                return True
            return False
        finally:
            model.open()
            await batcher.close()

    assert asyncio.run(late(True, None))
    assert not asyncio.run(late(True, 10**12))
    assert asyncio.run(late(False, 10**12))


def _gated_pairs(tmp_path: Path) -> Gated:
    """The linear model in batches of at most two rows, behind a gate."""
    fixture_models.linear(tmp_path, name="linear", config="max_batch_size: 2\n")
    config = load_model_config(tmp_path / "linear" / "config.yaml")
    spec = ModelVersionSpec("linear", "1", tmp_path / "linear" / "1", config)
    return Gated(OnnxRuntimeBackend(cores=1).load(spec))


def test_priority_levels_run_earlier_levels_first_each_under_its_own_bound(
        tmp_path: Path) -> None:
    """Behind a busy engine: requests of priority 2, none (the default, 2) and 1 queue, then
    1 (refused: level 1 holds one waiting request, its own policy), 9 (out of range: the
    default level, its third) and 2 (refused: the default policy's three). Batches of two
    rows take the priority 1 request first, then level 2 in arrival order."""
    model = _gated_pairs(tmp_path)
    stats = ModelStats("linear", "1")

    def call(batcher: Batcher, seed: int, priority: int | None) -> asyncio.Task[TensorDict]:
        inputs = {"x": features(seed)}
        parameters = {} if priority is None else {"priority": priority}
        request = InferRequest(inputs, parameters=parameters)
        return asyncio.create_task(batcher.infer(inputs, request=request))

    async def main() -> list[BaseException | TensorDict]:
        batcher = Batcher(model, stats, max_queue_size=3, priority_levels=2,
                          default_priority_level=2, priority_rules={1: QueueRule(1)})
        try:
            model.hold()
            first = asyncio.create_task(batcher.infer({"x": features(0)}))
            await model.busy()
            calls = [call(batcher, seed, priority)
                     for seed, priority in ((1, 2), (2, None), (3, 1), (4, 1), (5, 9), (6, 2))]
            await asyncio.sleep(0)
            model.open()
            return [await first, *await asyncio.gather(*calls, return_exceptions=True)]
        finally:
            await batcher.close()

    answers = asyncio.run(main())
    refused = {seed: answer for seed, answer in enumerate(answers)
               if isinstance(answer, BaseException)}
    assert sorted(refused) == [4, 6]
    assert all(isinstance(error, Overloaded) for error in refused.values())
    assert "at priority 1" in str(refused[4]) and "at priority 2" in str(refused[6])
    seen = [[float(row[0]) for row in batch["x"]] for batch in model.batches]
    assert seen == [[float(features(seed)[0, 0]) for seed in batch]
                    for batch in ([0], [3, 1], [2, 5])]


def test_under_delay_a_request_past_its_timeout_runs_after_the_others(tmp_path: Path) -> None:
    """timeout_action DELAY: behind a busy engine, a request queues, its 1 µs default timeout
    passes (injected clock), two more queue; batches of two take the two first, then the
    late one, which is answered, not refused."""
    model = _gated_pairs(tmp_path)
    now = [5_000]

    async def main() -> list[TensorDict]:
        batcher = Batcher(model, ModelStats("linear", "1"), clock=lambda: now[0],
                          default_timeout_ms=0.001, delay_on_timeout=True)
        try:
            model.hold()
            first = asyncio.create_task(batcher.infer({"x": features(0)}))
            await model.busy()
            late = asyncio.create_task(batcher.infer({"x": features(1)}))
            await asyncio.sleep(0)
            now[0] += 2_000  # past its timeout
            others = [asyncio.create_task(batcher.infer({"x": features(seed)}))
                      for seed in (2, 3)]
            await asyncio.sleep(0)
            model.open()
            return [await first, await late, *await asyncio.gather(*others)]
        finally:
            await batcher.close()

    answers = asyncio.run(main())
    assert len(answers) == 4
    seen = [[float(row[0]) for row in batch["x"]] for batch in model.batches]
    assert seen == [[float(features(seed)[0, 0]) for seed in batch]
                    for batch in ([0], [2, 3], [1])]
