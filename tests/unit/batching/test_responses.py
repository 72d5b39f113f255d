"""A decoupled request's response channel: bounded (a sender waits while the client is
`window` behind), cancelled when the client goes away; and the stream of responses through a
real batcher over a decoupled Triton model loaded in this process."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from serval.backends.base import ModelResponse, ModelVersionSpec
from serval.backends.python import PythonBackend
from serval.batching.batcher import Batcher
from serval.batching.responses import ResponseChannel, stream_responses
from serval.errors import DeadlineExceeded
from serval.model_config import load_model_config
from serval.protocol.types import InferRequest
from serval.stats import ModelStats
from tests import triton_python_models as models

pytestmark = pytest.mark.unit


def _out(value: int, final: bool = False) -> ModelResponse:
    return ModelResponse(outputs={"OUT": np.array([value])}, final=final)


async def _until(condition: object) -> None:
    for _ in range(2000):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the condition did not hold")


def _waiting(channel: ResponseChannel) -> bool:
    """Whether a sender waits for room (the channel's condition has a waiter)."""
    return bool(channel._room._waiters)  # type: ignore[attr-defined]


def test_a_sender_waits_while_the_client_is_a_window_behind() -> None:
    async def main() -> None:
        channel = ResponseChannel(asyncio.get_running_loop(), window=2)
        sent: list[int] = []

        def model() -> None:
            for value in range(5):
                channel.send(_out(value, final=value == 4))
                sent.append(value)

        thread = threading.Thread(target=model)
        thread.start()
        await _until(lambda: _waiting(channel))  # the third send waits for room
        assert sent == [0, 1]
        taken = [await channel.take()]
        await _until(lambda: len(sent) == 3)
        taken += [await channel.take() for _ in range(4)]
        thread.join()
        assert [int(r.outputs["OUT"][0]) for r in taken if r.outputs] == [0, 1, 2, 3, 4]
        assert taken[-1].final and channel.ended
        assert not channel.send(_out(9))  # after the final: dropped

    asyncio.run(main())


def test_takes_before_the_relay_is_in_place_are_told_to_it() -> None:
    """A worker process's first responses can be taken before its relay is set: their takes
    must reach the worker all the same, or its window would never open again."""
    async def main() -> None:
        channel = ResponseChannel(asyncio.get_running_loop(), window=4)
        channel.forward(_out(0))
        channel.forward(_out(1))
        await channel.take()
        await channel.take()
        told: list[str] = []
        channel.relay(lambda: told.append("taken"), lambda: told.append("cancelled"))
        assert told == ["taken", "taken"]
        channel.forward(_out(2, final=True))
        await channel.take()
        assert told == ["taken"] * 3

    asyncio.run(main())


def test_cancelling_wakes_a_waiting_sender_and_drops_what_follows() -> None:
    async def main() -> None:
        channel = ResponseChannel(asyncio.get_running_loop(), window=1)
        results: list[bool] = []
        told: list[str] = []
        channel.relay(lambda: told.append("taken"), lambda: told.append("cancelled"))
        thread = threading.Thread(target=lambda: results.extend(
            [channel.send(_out(0)), channel.send(_out(1))]))
        thread.start()
        await _until(lambda: _waiting(channel))  # the second send waits for room
        channel.cancel()
        channel.cancel()  # once
        await asyncio.to_thread(thread.join)
        assert results == [True, False] and channel.is_cancelled()
        assert told == ["cancelled"]
        await channel.take()
        assert told == ["cancelled", "taken"]

    asyncio.run(main())


def _decoupled_batcher(tmp_path: Path) -> Batcher:
    folder = models.write(tmp_path, "dec", models.DECOUPLED, models.AUTO_CONFIG)
    spec = ModelVersionSpec("dec", "1", folder / "1", load_model_config(folder / "config.yaml"))
    model = PythonBackend(allowed=True).load(spec)
    return Batcher(model, ModelStats("dec", "1"))


def test_a_requests_responses_come_through_the_batcher(tmp_path: Path) -> None:
    async def main() -> list[tuple[list[float], bool]]:
        batcher = _decoupled_batcher(tmp_path)
        request = InferRequest({"IN": np.array([2.0], np.float32)})
        got = [(r.outputs["OUT"].tolist() if r.outputs else [], r.final)
               async for r in stream_responses(batcher, request.inputs, None, request)]
        await batcher.close()
        return got

    assert asyncio.run(main()) == [([4.0], False), ([6.0], True)]


def test_a_request_whose_deadline_passed_in_the_queue_ends_with_that_error(
        tmp_path: Path) -> None:
    async def main() -> list[ModelResponse]:
        batcher = _decoupled_batcher(tmp_path)
        request = InferRequest({"IN": np.array([2.0], np.float32)})
        got = [r async for r in stream_responses(batcher, request.inputs, 0, request)]
        await batcher.close()
        return got

    [failed] = asyncio.run(main())
    assert failed.final and isinstance(failed.error, DeadlineExceeded)
