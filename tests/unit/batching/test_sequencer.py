"""The Sequencer over real ONNX Runtime sessions of the Triton sequence example models: rows
by slot with READY false for empty slots, state carried, a START waiting for a free slot, idle
expiry on an injected clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from serval.backends.base import LoadedModel, ModelMetadata, ModelVersionSpec
from serval.backends.onnxruntime import OnnxRuntimeBackend
from serval.batching.sequencer import Sequencer
from serval.errors import InvalidInput, Overloaded, ServerUnavailable
from serval.protocol.types import InferRequest, TensorDict
from serval.repository.triton_config import load_pbtxt
from serval.stats import ModelStats
from tests import triton_sequence_models

pytestmark = pytest.mark.unit


class Recorded:
    """A real model whose batches are recorded."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.batches: list[TensorDict] = []

    @property
    def metadata(self) -> ModelMetadata:
        return self.model.metadata

    def infer(self, inputs: TensorDict) -> TensorDict:
        self.batches.append(dict(inputs))
        return self.model.infer(inputs)

    def memory_bytes(self) -> int:
        return self.model.memory_bytes()

    def unload(self) -> None:
        self.model.unload()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return triton_sequence_models.build(tmp_path_factory.mktemp("sequencer"))


def _sequencer(repository: Path, name: str, clock: list[int] | None = None
               ) -> tuple[Sequencer, Recorded]:
    config = load_pbtxt(repository / name)
    assert config.sequence_batching is not None
    spec = ModelVersionSpec(name, "1", repository / name / "1", config)
    engine = Recorded(OnnxRuntimeBackend(cores=1).load(spec))
    kwargs = {} if clock is None else {"clock": lambda: clock[0]}
    return Sequencer(engine, config.sequence_batching, ModelStats(name, "1"), **kwargs), engine


async def _step(sequencer: Sequencer, sequence_id: int | str, value: float,
                dtype: type = np.int32, **flags: bool) -> float:
    inputs = {"INPUT": np.full((1, 1), value, dtype)}
    parameters = {"sequence_id": sequence_id, **{f"sequence_{k}": v for k, v in flags.items()}}
    outputs = await sequencer.infer(inputs, None, InferRequest(inputs, parameters=parameters))
    assert set(outputs) == {"OUTPUT"}  # state outputs never reach the client
    return float(outputs["OUTPUT"][0][0])


def test_direct_rows_sit_at_their_slots_with_ready_false_between(repository: Path) -> None:
    async def main() -> None:
        sequencer, engine = _sequencer(repository, "simple_dyna_sequence")
        for sequence_id in (10, 11, 12):
            assert await _step(sequencer, sequence_id, 5, start=True) == 6
        assert await _step(sequencer, 12, 7, end=True) == 7 + 12
        last = engine.batches[-1]
        assert last["READY"].ravel().tolist() == [0, 0, 1]
        assert last["CORRID"].ravel().tolist() == [0, 0, 12]
        assert last["END"].ravel().tolist() == [0, 0, 1]
        assert sequencer.live_sequences == 2
        await sequencer.close()

    asyncio.run(main())


def test_state_is_carried_and_a_start_waits_for_a_free_slot(repository: Path) -> None:
    """accumulate: oldest strategy, two candidate sequences."""
    async def main() -> None:
        sequencer, _ = _sequencer(repository, "accumulate")
        assert await _step(sequencer, 1, 1.0, np.float32, start=True) == 1.0
        assert await _step(sequencer, 2, 10.0, np.float32, start=True) == 10.0
        assert await _step(sequencer, 1, 2.0, np.float32) == 3.0
        third = asyncio.create_task(_step(sequencer, 3, 4.0, np.float32, start=True))
        while not sequencer.waiting_starts:
            await asyncio.sleep(0)
        assert not third.done()
        assert await _step(sequencer, 2, 5.0, np.float32, end=True) == 15.0
        assert await third == 4.0
        await sequencer.close()

    asyncio.run(main())


def test_a_start_past_its_deadline_without_a_slot_is_overloaded(repository: Path) -> None:
    async def main() -> None:
        sequencer, _ = _sequencer(repository, "accumulate")
        for sequence_id in (1, 2):
            await _step(sequencer, sequence_id, 1.0, np.float32, start=True)
        inputs = {"INPUT": np.ones((1, 1), np.float32)}
        request = InferRequest(inputs, parameters={"sequence_id": 3, "sequence_start": True})
        with pytest.raises(Overloaded, match="all 2 sequence slots"):
            await sequencer.infer(inputs, 0, request)  # a deadline long past
        await sequencer.close()
        with pytest.raises(ServerUnavailable):
            await sequencer.infer(inputs, None, request)

    asyncio.run(main())


def test_idle_sequences_expire_on_the_injected_clock(repository: Path) -> None:
    async def main() -> None:
        now = [0]
        sequencer, _ = _sequencer(repository, "accumulate", now)  # 300 ms idle
        await _step(sequencer, "s", 1.0, np.float32, start=True)
        now[0] += 299_000_000
        assert sequencer.expire_idle() == 0
        now[0] += 1_000_000
        assert sequencer.expire_idle() == 1 and sequencer.live_sequences == 0
        with pytest.raises(InvalidInput, match="ended after 300 ms idle"):
            await _step(sequencer, "s", 1.0, np.float32)
        await sequencer.close()

    asyncio.run(main())


def test_steps_after_the_end_fail_unless_the_id_starts_again(repository: Path) -> None:
    async def main() -> None:
        sequencer, _ = _sequencer(repository, "accumulate")
        await _step(sequencer, 5, 1.0, np.float32, start=True)
        end = asyncio.create_task(_step(sequencer, 5, 1.0, np.float32, end=True))
        late = asyncio.create_task(_step(sequencer, 5, 1.0, np.float32))
        restart = asyncio.create_task(_step(sequencer, 6, 3.0, np.float32, start=True))
        assert await end == 2.0 and await restart == 3.0
        with pytest.raises(InvalidInput, match="ended"):
            await late
        await sequencer.close()

    asyncio.run(main())


def _unbatched(root: Path) -> Path:
    """An accumulator without a batch axis (max_batch_size 0): INPUT, STATE [1]."""
    import onnx
    from onnx import TensorProto, helper

    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1])
          for n in ("INPUT", "STATE_IN", "OUTPUT", "STATE_OUT")]
    graph = helper.make_graph([helper.make_node("Add", ["STATE_IN", "INPUT"], ["STATE_OUT"]),
                               helper.make_node("Identity", ["STATE_OUT"], ["OUTPUT"])],
                              "unbatched", io[:2], io[2:])
    (root / "unbatched" / "1").mkdir(parents=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, root / "unbatched" / "1" / "model.onnx")
    (root / "unbatched" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 0\nsequence_batching { state [ { '
        'input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ] }\n')
    return root


def test_a_model_without_a_batch_axis_runs_one_sequence_step_at_a_time(tmp_path: Path) -> None:
    async def main() -> None:
        sequencer, engine = _sequencer(_unbatched(tmp_path), "unbatched")

        async def step(sequence_id: int, value: float, **flags: bool) -> float:
            inputs = {"INPUT": np.full((1,), value, np.float32)}
            parameters = {"sequence_id": sequence_id,
                          **{f"sequence_{k}": v for k, v in flags.items()}}
            outputs = await sequencer.infer(inputs, None, InferRequest(inputs,
                                                                       parameters=parameters))
            return float(outputs["OUTPUT"][0])

        assert await step(1, 2.0, start=True) == 2.0
        assert await step(1, 3.0) == 5.0
        assert await step(1, 4.0, end=True) == 9.0
        assert all(batch["STATE_IN"].shape == (1,) for batch in engine.batches)
        await sequencer.close()

    asyncio.run(main())


def test_drain_waits_for_every_waiting_step(repository: Path) -> None:
    async def main() -> None:
        sequencer, _ = _sequencer(repository, "accumulate")
        steps = [asyncio.create_task(_step(sequencer, 7, 1.0, np.float32, start=True)),
                 asyncio.create_task(_step(sequencer, 7, 1.0, np.float32))]
        while not sequencer.queued:
            await asyncio.sleep(0)
        await sequencer.drain()
        assert sequencer.queued == 0 and sequencer.running == 0
        assert [await step for step in steps] == [1.0, 2.0]
        await sequencer.close()

    asyncio.run(main())


def test_steps_of_a_sequence_waiting_for_a_slot_queue_behind_its_start(repository: Path
                                                                        ) -> None:
    """A stream may send a backlogged sequence's next steps before its START has a slot."""
    async def main() -> None:
        sequencer, _ = _sequencer(repository, "accumulate")  # two candidate sequences
        for sequence_id in (1, 2):
            await _step(sequencer, sequence_id, 1.0, np.float32, start=True)
        start = asyncio.create_task(_step(sequencer, 3, 4.0, np.float32, start=True))
        follow = asyncio.create_task(_step(sequencer, 3, 5.0, np.float32, end=True))
        while not sequencer.waiting_starts:
            await asyncio.sleep(0)
        await _step(sequencer, 1, 1.0, np.float32, end=True)
        assert (await start, await follow) == (4.0, 9.0)
        await sequencer.close()

    asyncio.run(main())


def test_a_string_corrid_takes_an_integer_id_as_its_string(repository: Path) -> None:
    """The model sees id 5 and id "5" as the same CORRID, "5": they were two sequences, each
    with its own state, that the model could not tell apart."""
    async def main() -> None:
        sequencer, engine = _sequencer(repository, "simple_string_dyna_sequence")
        assert await _step(sequencer, 5, 10, start=True) == 10
        assert await _step(sequencer, "5", 1) == 11  # the same accumulator
        assert await _step(sequencer, 5, 1, end=True) == 12 + 5
        assert engine.batches[-1]["CORRID"].ravel().tolist() == ["5"]
        assert sequencer.live_sequences == 0
        await sequencer.close()

    asyncio.run(main())
