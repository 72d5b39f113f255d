"""ModelStreamInfer with decoupled requests: their responses leave as they come, ahead of
ordered answers still running; a bare final flag is sent only when asked for; a slot is held
until a request's last response; closing the call closes each running request's stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import numpy as np
import pytest

from serval.protocol.grpc import grpc_service_pb2 as pb
from serval.protocol.grpc.status import GrpcStatus
from serval.protocol.types import InferResponse
from serval.server.grpc.stream_infer import EMPTY_FINAL, FINAL_RESPONSE, StreamCall
from serval.server.streams import StreamedResponse

pytestmark = pytest.mark.unit


class Context:
    def __init__(self, slots: int) -> None:
        self.max_stream_messages = slots


class Scripted:
    """Decoupled requests (id starting 'd') send what the test puts in their queue; the
    others answer once their gate opens."""

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[StreamedResponse]] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.closed: list[str] = []

    async def ordered(self, request: Any) -> pb.ModelStreamInferResponse:
        await self.gates.setdefault(request.id, asyncio.Event()).wait()
        answer = pb.ModelStreamInferResponse(infer_response=pb.ModelInferResponse(id=request.id))
        answer.infer_response.parameters[FINAL_RESPONSE].bool_param = True
        return answer

    async def decoupled(self, request: Any) -> bool:
        return bool(request.id.startswith("d"))

    async def stream(self, request: Any, window: int) -> AsyncGenerator[StreamedResponse, None]:
        queue = self.queues.setdefault(request.id, asyncio.Queue())
        try:
            while True:
                item = await queue.get()
                yield item
                if item.final:
                    return
        finally:
            self.closed.append(request.id)

    def send(self, request_id: str, value: int | None, final: bool = False) -> None:
        outputs = {} if value is None else {"OUT": np.array([value], np.int32)}
        self.queues.setdefault(request_id, asyncio.Queue()).put_nowait(StreamedResponse(
            InferResponse("m", "1", outputs, request_id), None, final))


def _call(script: Scripted, slots: int = 8) -> StreamCall:
    return StreamCall(script.ordered, script.decoupled, script.stream, Context(slots), slots)


async def _requests(ids: list[str], empty_final: set[str] = frozenset(),  # type: ignore[assignment]
                    ) -> AsyncIterator[pb.ModelInferRequest]:
    for request_id in ids:
        request = pb.ModelInferRequest(id=request_id, model_name="m")
        if request_id in empty_final:
            request.parameters[EMPTY_FINAL].bool_param = True
        yield request


def _seen(answer: pb.ModelStreamInferResponse) -> tuple[str, list[int], bool]:
    response = answer.infer_response
    values = [int(v) for v in np.frombuffer(b"".join(response.raw_output_contents), np.int32)]
    return response.id, values, response.parameters[FINAL_RESPONSE].bool_param


def test_decoupled_responses_leave_as_they_come_beside_ordered_answers() -> None:
    async def main() -> list[tuple[str, list[int], bool]]:
        script = Scripted()
        answers = _call(script).answers(_requests(["o1", "d1", "o2", "d2"]))
        script.send("d2", 20)
        seen = [_seen(await anext(answers))]  # d2 answers first: it sent first
        script.send("d1", 10)
        seen.append(_seen(await anext(answers)))
        script.gates.setdefault("o2", asyncio.Event()).set()  # o2 waits for o1 all the same
        script.send("d1", 11, final=True)
        seen.append(_seen(await anext(answers)))
        script.gates.setdefault("o1", asyncio.Event()).set()
        seen += [_seen(await anext(answers)), _seen(await anext(answers))]
        script.send("d2", None, final=True)  # a bare final: nothing sent, the call ends
        seen += [_seen(answer) async for answer in answers]
        return seen

    assert asyncio.run(main()) == [
        ("d2", [20], False), ("d1", [10], False), ("d1", [11], True),
        ("o1", [], True), ("o2", [], True)]


def test_a_bare_final_flag_is_sent_only_when_asked_for() -> None:
    async def main() -> list[tuple[str, list[int], bool]]:
        script = Scripted()
        answers = _call(script).answers(_requests(["d1", "d2"], {"d2"}))
        script.send("d1", None, final=True)
        script.send("d2", None, final=True)
        return [_seen(answer) async for answer in answers]

    assert asyncio.run(main()) == [("d2", [], True)]


def test_a_slot_is_held_until_a_requests_last_response() -> None:
    async def main() -> None:
        script = Scripted()
        pulled: list[str] = []

        async def requests() -> AsyncIterator[pb.ModelInferRequest]:
            for request_id in ("d1", "d2"):
                pulled.append(request_id)
                yield pb.ModelInferRequest(id=request_id, model_name="m")

        answers = _call(script, slots=1).answers(requests())
        script.send("d1", 1)
        assert _seen(await anext(answers)) == ("d1", [1], False)
        assert pulled == ["d1"]  # d1 still holds the one slot
        script.send("d1", 2, final=True)
        assert _seen(await anext(answers)) == ("d1", [2], True)
        script.send("d2", 3, final=True)
        assert _seen(await anext(answers)) == ("d2", [3], True)
        assert pulled == ["d1", "d2"]
        assert [answer async for answer in answers] == []

    asyncio.run(main())


def test_closing_the_call_closes_each_running_stream() -> None:
    async def main() -> list[str]:
        script = Scripted()
        answers = _call(script).answers(_requests(["d1", "d2"]))
        script.send("d1", 1)
        await anext(answers)
        await answers.aclose()
        for _ in range(100):
            if len(script.closed) == 2:
                break
            await asyncio.sleep(0)
        return sorted(script.closed)

    assert asyncio.run(main()) == ["d1", "d2"]


class Aborted(Exception):
    pass


class DeadlineContext(Context):
    """A stream with grpc-timeout: `abort` raises as grpc's does, and records its status."""

    def __init__(self, slots: int, remaining_s: float) -> None:
        super().__init__(slots)
        self.remaining_s, self.aborted = remaining_s, []  # type: list[tuple[Any, str]]

    def time_remaining(self) -> float:
        return self.remaining_s

    async def abort(self, code: Any, message: str) -> None:
        self.aborted.append((code, message))
        raise Aborted(message)


def test_the_streams_deadline_ends_the_call_and_cancels_what_still_runs() -> None:
    async def main() -> tuple[list[tuple[Any, str]], bool, list[str]]:
        script = Scripted()
        context = DeadlineContext(8, 0.05)
        call = StreamCall(script.ordered, script.decoupled, script.stream, context, 8)
        answers = call.answers(_requests(["o1", "d1"]))
        script.send("d1", 1)
        first = _seen(await anext(answers))  # within the deadline: answered
        assert first == ("d1", [1], False)
        with pytest.raises(Aborted):  # o1 never answers: the deadline ends the call
            await anext(answers)
        await answers.aclose()
        for _ in range(100):
            if script.closed and not call._tasks:
                break
            await asyncio.sleep(0)
        return context.aborted, bool(call._tasks), script.closed

    aborted, still_running, closed = asyncio.run(main())
    assert [code for code, _ in aborted] == [GrpcStatus.DEADLINE_EXCEEDED]
    assert "deadline passed" in aborted[0][1]
    assert not still_running and closed == ["d1"]


def test_a_decoupled_answer_known_without_a_load_is_not_awaited() -> None:
    async def main() -> list[tuple[str, list[int], bool]]:
        script = Scripted()
        call = StreamCall(script.ordered, lambda request: request.id.startswith("d"),
                          script.stream, Context(8), 8)
        answers = call.answers(_requests(["d1", "o1"]))
        script.send("d1", 7, final=True)
        script.gates.setdefault("o1", asyncio.Event()).set()
        return [_seen(answer) async for answer in answers]

    assert asyncio.run(main()) == [("d1", [7], True), ("o1", [], True)]


def test_an_answer_still_waiting_when_the_deadline_passes_is_not_sent() -> None:
    async def main() -> tuple[list[tuple[Any, str]], tuple[str, list[int], bool]]:
        script = Scripted()
        context = DeadlineContext(8, 0.05)
        call = StreamCall(script.ordered, script.decoupled, script.stream, context, 8)
        answers = call.answers(_requests(["d1", "d2"]))
        script.send("d1", 1)
        first = _seen(await anext(answers))
        script.send("d2", 2, final=True)  # waits in the outbox while the deadline passes
        await asyncio.sleep(0.1)  # time itself is under test: past the 50 ms deadline
        assert call._outbox  # (the case under test: an answer is ready, the deadline gone)
        with pytest.raises(Aborted):
            await anext(answers)
        await answers.aclose()
        return context.aborted, first

    aborted, first = asyncio.run(main())
    assert first == ("d1", [1], False)
    assert [code for code, _ in aborted] == [GrpcStatus.DEADLINE_EXCEEDED]
