"""ModelStreamInfer's ordering: requests of a stream run together, answers leave in request
order, and at most max_stream_messages are running or waiting to be sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from serval.dataplane import DataPlane
from serval.protocol.grpc import grpc_service_pb2 as pb
from serval.server.grpc.servicer import InferenceServicer

pytestmark = pytest.mark.unit


class Context:
    def __init__(self, slots: int) -> None:
        self.max_stream_messages = slots

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return []


class Scripted(InferenceServicer):
    """Each request's answer waits for its gate: the test decides what finishes when."""

    def __init__(self, ids: list[str]) -> None:
        super().__init__(dataplane=cast(DataPlane, None))  # ModelStreamInfer's own logic only
        self.gates = {request_id: asyncio.Event() for request_id in ids}
        self.started: list[str] = []

    async def _decoupled(self, request: Any, token: str | None) -> bool:
        return False  # every model here answers once

    async def _stream_one(self, request: Any, token: str | None) -> pb.ModelStreamInferResponse:
        self.started.append(request.id)
        await self.gates[request.id].wait()
        return pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=request.id))


async def _requests(ids: list[str], pulled: list[str]) -> AsyncIterator[pb.ModelInferRequest]:
    for request_id in ids:
        pulled.append(request_id)
        yield pb.ModelInferRequest(id=request_id)


async def _until(condition: Any) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition did not hold")


def test_answers_leave_in_request_order_whatever_finishes_first() -> None:
    ids = ["a", "b", "c"]

    async def main() -> list[str]:
        servicer = Scripted(ids)
        answers = servicer.ModelStreamInfer(_requests(ids, []), Context(8))
        first = asyncio.ensure_future(anext(answers))
        await _until(lambda: servicer.started == ids)  # all three run together
        servicer.gates["c"].set()
        servicer.gates["b"].set()
        for _ in range(50):  # loop turns, not time: b and c finish, a does not
            await asyncio.sleep(0)
        assert not first.done()  # nothing may leave before a
        servicer.gates["a"].set()
        order = [(await first).infer_response.id]
        order += [answer.infer_response.id async for answer in answers]
        return order

    assert asyncio.run(main()) == ids


def test_a_slow_first_request_holds_the_reading_at_the_slot_limit() -> None:
    ids = ["a", "b", "c", "d"]

    async def main() -> None:
        servicer = Scripted(ids)
        pulled: list[str] = []
        answers = servicer.ModelStreamInfer(_requests(ids, pulled), Context(2))
        first = asyncio.ensure_future(anext(answers))
        servicer.gates["b"].set()
        await _until(lambda: servicer.started == ["a", "b"])
        for _ in range(50):  # loop turns, not time: the reader waits for a slot
            await asyncio.sleep(0)
        assert pulled == ["a", "b"] and not first.done()
        servicer.gates["a"].set()
        assert (await first).infer_response.id == "a"
        servicer.gates["c"].set()
        servicer.gates["d"].set()
        rest = [answer.infer_response.id async for answer in answers]
        assert rest == ["b", "c", "d"] and pulled == ids

    asyncio.run(main())


def test_closing_the_call_cancels_what_still_runs() -> None:
    ids = ["a", "b"]

    async def main() -> None:
        servicer = Scripted(ids)
        answers = servicer.ModelStreamInfer(_requests(ids, []), Context(8))
        first = asyncio.ensure_future(anext(answers))
        await _until(lambda: servicer.started == ids)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await answers.aclose()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await _until(lambda: all(t.done() for t in tasks))

    asyncio.run(main())
