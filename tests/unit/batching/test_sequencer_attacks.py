"""Sequence batching against hostile ids and careless models, below the server: string ids
bounded in bytes, integer ids checked against the CORRID control's range; over real ONNX
Runtime sessions, one sequence's failure stays its own and the consumer task survives it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from serval.backends.base import ModelVersionSpec
from serval.backends.onnxruntime import OnnxRuntimeBackend
from serval.batching.sequence_policy import (
    MAX_STRING_ID_BYTES,
    LiveSequence,
    SequenceFlags,
    SequenceTable,
    sequence_flags,
)
from serval.batching.sequence_tensors import check_corrid
from serval.batching.sequencer import Sequencer
from serval.errors import (
    BackendError,
    DeadlineExceeded,
    EngineRejectedInput,
    InvalidInput,
    ServerUnavailable,
)
from serval.model_config import SequenceBatchingConfig, SequenceControl
from serval.protocol.types import InferRequest
from serval.repository.triton_config import load_pbtxt
from serval.stats import ModelStats
from tests.triton_examples import write_model

pytestmark = pytest.mark.unit


def test_a_string_id_is_at_most_1024_bytes_of_utf8() -> None:
    assert sequence_flags({"sequence_id": "a" * MAX_STRING_ID_BYTES}, "m").id == "a" * 1024
    assert sequence_flags({"sequence_id": "é" * 512}, "m").id == "é" * 512
    for too_long in ("a" * 1025, "é" * 513, "\ud800" * 342):  # a lone surrogate is 3 bytes
        with pytest.raises(InvalidInput, match="at most 1024 bytes") as caught:
            sequence_flags({"sequence_id": too_long}, "m")
        assert too_long[:16] not in str(caught.value)


@pytest.mark.parametrize(("datatype", "largest"), [
    ("INT32", 2**31 - 1), ("UINT32", 2**32 - 1), ("INT64", 2**63 - 1), ("UINT64", 2**64 - 1),
    ("INT16", 2**15 - 1)])
def test_an_integer_id_fits_the_corrid_datatype(datatype: str, largest: int) -> None:
    settings = SequenceBatchingConfig(controls=[SequenceControl(
        name="CORRID", kind="corrid", datatype=datatype)])
    check_corrid(settings, largest, "m")
    with pytest.raises(InvalidInput, match=f"ids 1 to {largest}"):
        check_corrid(settings, largest + 1, "m")


def test_a_float_or_string_corrid_takes_any_integer_id() -> None:
    for datatype in ("FP32", "BYTES"):
        settings = SequenceBatchingConfig(controls=[SequenceControl(
            name="CORRID", kind="corrid", datatype=datatype)])
        check_corrid(settings, 2**64 - 1, "m")


# --- the Sequencer over real ONNX Runtime sessions --------------------------------------------

def _model(root: Path, name: str, graph: onnx.GraphProto, pbtxt_body: str,
           clock: Callable[[], int] | None = None) -> Sequencer:
    write_model(root, name, graph, f'name: "{name}"\nplatform: "onnxruntime_onnx"\n'
                + pbtxt_body)
    config = load_pbtxt(root / name)
    assert config.sequence_batching is not None
    spec = ModelVersionSpec(name, "1", root / name / "1", config)
    engine = OnnxRuntimeBackend(cores=1).load(spec)
    kwargs = {} if clock is None else {"clock": clock}
    return Sequencer(engine, config.sequence_batching, ModelStats(name, "1"), **kwargs)


def _lookup(root: Path) -> Sequencer:
    """OUTPUT = TABLE[INPUT] + START (a 4-row table: an index past 3 is the client's error)."""
    table = helper.make_tensor("TABLE", TensorProto.FLOAT, [4], [10.0, 20.0, 30.0, 40.0])
    nodes = [helper.make_node("Gather", ["TABLE", "INPUT"], ["row"]),
             helper.make_node("Cast", ["START"], ["start"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["row", "start"], ["OUTPUT"])]
    graph = helper.make_graph(
        nodes, "lookup",
        [helper.make_tensor_value_info("INPUT", TensorProto.INT64, ["batch", 1]),
         helper.make_tensor_value_info("START", TensorProto.INT32, ["batch", 1])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", 1])],
        initializer=[table])
    return _model(root, "lookup", graph, (
        "max_batch_size: 4\nsequence_batching {\n  max_sequence_idle_microseconds: 5000000\n"
        '  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START '
        "int32_false_true: [ 0, 1 ] } ] } ]\n}\n"
        'input [ { name: "INPUT" data_type: TYPE_INT64 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'))


def _growing(root: Path, clock: Callable[[], int] | None = None) -> Sequencer:
    """Not batched: STATE_OUT = STATE_IN + INPUT, INPUT any length, the state dims [1]: a
    longer INPUT makes a state the config does not describe."""
    nodes = [helper.make_node("Add", ["STATE_IN", "INPUT"], ["STATE_OUT"]),
             helper.make_node("Identity", ["STATE_OUT"], ["OUTPUT"])]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "growing",
        [helper.make_tensor_value_info("INPUT", f32, ["n"]),
         helper.make_tensor_value_info("STATE_IN", f32, [1])],
        [helper.make_tensor_value_info("OUTPUT", f32, ["m"]),
         helper.make_tensor_value_info("STATE_OUT", f32, ["m"])])
    return _model(root, "growing", graph, (
        "max_batch_size: 0\nsequence_batching {\n  max_sequence_idle_microseconds: 5000000\n"
        '  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 '
        "dims: [ 1 ] } ]\n}\n"
        'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'), clock)


async def _infer(sequencer: Sequencer, array: np.ndarray, **parameters: Any) -> np.ndarray:
    inputs = {"INPUT": array}
    request = InferRequest(inputs, parameters=parameters)
    outputs = await asyncio.wait_for(sequencer.infer(inputs, None, request), 10)
    return outputs["OUTPUT"]


async def _start_waiting(sequencer: Sequencer, one: np.ndarray) -> asyncio.Future[Any]:
    """Sequence 1 takes the one slot; sequence 2's START, returned, waits for one."""
    await _infer(sequencer, one, sequence_id=1, sequence_start=True)
    waiting = asyncio.ensure_future(_infer(sequencer, one, sequence_id=2, sequence_start=True))
    while not sequencer.waiting_starts:
        await asyncio.sleep(0.001)
    return waiting


def test_one_sequences_bad_values_do_not_fail_its_batch_mates(tmp_path: Path) -> None:
    """An index out of the table in one sequence's step failed every step of its batch
    (other clients' sequences) with that client's error."""
    async def main() -> None:
        sequencer = _lookup(tmp_path)
        good, bad = np.array([[2]], np.int64), np.array([[9]], np.int64)
        results = await asyncio.gather(
            _infer(sequencer, good, sequence_id=1, sequence_start=True),
            _infer(sequencer, bad, sequence_id=2, sequence_start=True),
            _infer(sequencer, good, sequence_id=3, sequence_start=True),
            return_exceptions=True)
        assert [r.tolist() if isinstance(r, np.ndarray) else r for r in results[::2]] == [
            [[31.0]], [[31.0]]]
        assert isinstance(results[1], EngineRejectedInput), results[1]
        assert (await _infer(sequencer, good, sequence_id=2)).tolist() == [[30.0]]
        await sequencer.close()

    asyncio.run(main())


def test_a_state_the_config_does_not_describe_fails_its_step_not_the_model(
        tmp_path: Path) -> None:
    """A state output of 3 values where the config says [1] raised in the consumer task,
    which died: that step and every later one of the model waited for ever."""
    async def main() -> None:
        sequencer = _growing(tmp_path)
        with pytest.raises(BackendError, match=r"state output 'STATE_OUT' shaped \[3\]; its "
                                               r"sequence_batching state dims are \[1\]"):
            await _infer(sequencer, np.ones(3, np.float32), sequence_id=1, sequence_start=True)
        # the failed step left sequence 1's state as it was (the initial zeros)
        assert (await _infer(sequencer, np.full(1, 4.0, np.float32), sequence_id=1,
                             sequence_end=True)).tolist() == [4.0]
        assert (await _infer(sequencer, np.full(1, 2.0, np.float32), sequence_id=2,
                             sequence_start=True)).tolist() == [2.0]
        assert (await _infer(sequencer, np.full(1, 3.0, np.float32), sequence_id=2,
                             sequence_end=True)).tolist() == [5.0]
        await sequencer.close()

    asyncio.run(main())


def test_a_start_waiting_for_a_slot_fails_when_the_model_closes(tmp_path: Path) -> None:
    """close() woke the STARTs waiting for a slot, which then took one of the slots it had
    just freed and queued a step no consumer would run: the request hung."""
    async def main() -> None:
        sequencer = _growing(tmp_path)  # not batched, one instance: one slot
        one = np.ones(1, np.float32)
        waiting = await _start_waiting(sequencer, one)
        await sequencer.close()
        with pytest.raises(ServerUnavailable):
            await asyncio.wait_for(waiting, 5)

    asyncio.run(main())


def test_close_stops_a_consumer_whose_wakeup_came_with_the_cancel(tmp_path: Path) -> None:
    """A step queued in the same turn of the loop as close(): the consumer, waiting with a
    timeout (a live idle sequence), had its cancellation swallowed by Python 3.11's wait_for
    and close() waited for it for ever."""
    async def main() -> None:
        sequencer = _growing(tmp_path)
        one = np.ones(1, np.float32)
        await _infer(sequencer, one, sequence_id=1, sequence_start=True)
        inputs = {"INPUT": one}
        queued = asyncio.ensure_future(sequencer.infer(inputs, None, InferRequest(
            inputs, parameters={"sequence_id": 1})))
        await asyncio.sleep(0)  # one turn: the step is queued, the consumer's event set
        assert sequencer.queued == 1
        await asyncio.wait_for(sequencer.close(), 5)
        with pytest.raises(ServerUnavailable):
            await queued

    asyncio.run(main())


def test_an_integer_id_past_64_bits_is_named_as_such() -> None:
    """JSON reads 18446744073709551616 as a float: the error said only 'not float'."""
    with pytest.raises(InvalidInput, match=r"1\.8446744073709552e\+19.*1 to "
                                           r"18446744073709551615"):
        sequence_flags({"sequence_id": float(2**64)}, "m")


def test_a_slot_a_late_step_frees_goes_to_the_start_waiting_for_one(tmp_path: Path) -> None:
    """A late step of a sequence past its idle time frees its slot; the START waiting for a
    slot was not told and waited out its whole wait (the idle time, 5 s here)."""
    async def main() -> None:
        now = [0]
        sequencer = _growing(tmp_path, lambda: now[0])  # one slot, 5 s idle
        one = np.ones(1, np.float32)
        waiting = await _start_waiting(sequencer, one)
        now[0] += 5_000_000_000  # sequence 1 is idle past its time
        with pytest.raises(InvalidInput, match="idle"):
            await _infer(sequencer, one, sequence_id=1)
        assert (await asyncio.wait_for(waiting, 2)).tolist() == [1.0]
        await sequencer.close()

    asyncio.run(main())


class _CountingTable(SequenceTable):
    """A table that counts the sequences it judges idle or not."""

    judged = 0

    def _idle(self, sequence: LiveSequence, now_ns: int) -> bool:
        self.judged += 1
        return super()._idle(sequence, now_ns)


def test_expiry_and_batches_look_at_few_sequences_of_many_live() -> None:
    """Every batch scanned every live sequence (ready, expire, next expiry) and every start
    sorted every free slot: 100k live sequences (oldest, max_candidate_sequences) cost the
    event loop 24 ms a batch and 340 us a start. Now a batch looks at the waiting ones and
    the least recently active one; a table of INT32_MAX slots costs nothing until used."""
    table = _CountingTable(2**31 - 1, 100_000, "m")
    for sequence_id in range(1, 10_001):
        assert table.admit(SequenceFlags(sequence_id, start=True), sequence_id) is not None
    assert table.ready() == [] and table.next_expiry_ns() == 1 + 100_000
    assert table.expire(100_000) == [] and table.judged == 0
    expired = table.expire(100_000 + 5)  # the five least recently active
    assert [s.id for s in expired] == [1, 2, 3, 4, 5] and table.judged == 5
    sequence = table.live[9]
    assert table.admit(SequenceFlags(9), 50_000) is sequence  # active again: last to expire
    assert table.admit(SequenceFlags(10_001, start=True), 50_001).slot == 0  # the lowest free
    assert [s.id for s in table.expire(10_000 + 100_000)] == [6, 7, 8, *range(10, 10_001)]
    assert list(table.live) == [9, 10_001]


def test_a_freed_slot_goes_to_the_start_that_waited_first(tmp_path: Path) -> None:
    """A new START that found the table full expired the idle sequences itself, which woke
    the START waiting for a slot, then took that slot first: under a flood of new STARTs
    the one waiting got none and its client a 429 at the end of its wait."""
    async def main() -> None:
        now = [0]
        sequencer = _growing(tmp_path, lambda: now[0])  # one slot, 5 s idle
        one = np.ones(1, np.float32)
        first = await _start_waiting(sequencer, one)
        now[0] += 5_000_000_000  # sequence 1 is idle past its time
        second = asyncio.ensure_future(_infer(sequencer, 2 * one, sequence_id=3,
                                              sequence_start=True, sequence_end=True))
        assert (await asyncio.wait_for(first, 2)).tolist() == [1.0]
        assert not second.done()
        await _infer(sequencer, one, sequence_id=2, sequence_end=True)
        assert (await asyncio.wait_for(second, 2)).tolist() == [2.0]
        await sequencer.close()

    asyncio.run(main())


def test_a_retired_model_fails_the_starts_waiting_for_a_slot(tmp_path: Path) -> None:
    """An unload waits for the model's in-flight requests; a START waiting for a slot is one,
    and waited out max_sequence_idle (up to hours) before the unload could go on."""
    async def main() -> None:
        sequencer = _growing(tmp_path)  # one slot, 5 s idle
        one = np.ones(1, np.float32)
        waiting = await _start_waiting(sequencer, one)
        sequencer.retire()
        with pytest.raises(ServerUnavailable, match="being unloaded"):
            await asyncio.wait_for(waiting, 2)
        assert (await _infer(sequencer, one, sequence_id=1, sequence_end=True)).tolist() == [
            2.0]  # the live sequence still runs
        await sequencer.close()

    asyncio.run(main())


def test_a_step_whose_deadline_passed_in_the_queue_is_answered_and_not_run(
        tmp_path: Path) -> None:
    """A step queued past its deadline ran anyway, when its turn came: the client had been
    told the request timed out, yet the sequence's state moved on by that step."""
    async def main() -> None:
        now = [0]
        sequencer = _growing(tmp_path, lambda: now[0])  # STATE = STATE + INPUT
        one = np.ones(1, np.float32)
        assert (await _infer(sequencer, one, sequence_id=1, sequence_start=True)).tolist() == [1]

        def step(value: float, deadline_ns: int | None) -> asyncio.Future[Any]:
            inputs = {"INPUT": np.full(1, value, np.float32)}
            request = InferRequest(inputs, parameters={"sequence_id": 1})
            return asyncio.ensure_future(sequencer.infer(inputs, deadline_ns, request))

        ahead, late = step(1, None), step(100, 1_000)  # `late` waits for `ahead` to run
        await asyncio.sleep(0)
        now[0] = 2_000  # past `late`'s deadline before its turn comes
        assert (await asyncio.wait_for(ahead, 10))["OUTPUT"].tolist() == [2]
        with pytest.raises(DeadlineExceeded, match="queued"):
            await asyncio.wait_for(late, 10)
        assert (await _infer(sequencer, one, sequence_id=1)).tolist() == [3]  # not 103
        await sequencer.close()

    asyncio.run(main())


def test_a_failed_restart_of_a_live_id_does_not_continue_the_old_sequence(
        tmp_path: Path) -> None:
    """A START for an id still live whose step failed left the old sequence's state in
    place: the client's next steps, meant for its new sequence, ran on the old one's."""
    async def main() -> None:
        sequencer = _growing(tmp_path)  # STATE = STATE + INPUT
        one = np.ones(1, np.float32)
        await _infer(sequencer, np.full(1, 50.0, np.float32), sequence_id=1,
                     sequence_start=True)  # the old sequence holds 50
        with pytest.raises(BackendError, match="state output"):  # a restart that fails
            await _infer(sequencer, np.ones(3, np.float32), sequence_id=1, sequence_start=True)
        assert (await _infer(sequencer, one, sequence_id=1)).tolist() == [1.0]  # not 51
        await sequencer.close()

    asyncio.run(main())
