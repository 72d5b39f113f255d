"""Triton's sequence client examples (triton-inference-server/client, src/python/examples:
simple_{http,grpc}_sequence_sync_infer_client, simple_grpc_sequence_stream_infer_client,
simple_grpc_aio_sequence_stream_infer_client), call for call, with and without --dyna, against
the sequence models of tests/triton_sequence_models.py (config.pbtxt and model.onnx only)."""

from __future__ import annotations

import asyncio
import queue
import uuid
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import triton_sequence_models
from tests.conftest import RunningServer

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")

pytestmark = pytest.mark.integration

VALUES = [11, 7, 5, 3, 2, 0, 1]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return triton_sequence_models.build(tmp_path_factory.mktemp("triton-sequences"))


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer], repository: Path) -> RunningServer:
    return server_factory(repository)


class Plan:
    """What the examples send: two integer sequences and one string sequence, and to which
    model each goes (the dyna models with --dyna)."""

    def __init__(self, dyna: bool, offset: int = 0) -> None:
        self.dyna = dyna
        self.int_model = "simple_dyna_sequence" if dyna else "simple_sequence"
        self.string_model = "simple_string_dyna_sequence" if dyna else "simple_sequence"
        self.id0, self.id1 = 1000 + offset * 2, 1001 + offset * 2
        self.string_id = str(1002 + offset) if dyna else str(uuid.uuid4())
        self.sequences = [(self.id0, [0, *VALUES], self.int_model),
                          (self.id1, [100, *[-v for v in VALUES]], self.int_model),
                          (self.string_id, [20, *[-v for v in VALUES]], self.string_model)]

    def check(self, int0: list[Any], int1: list[Any], string0: list[Any]) -> None:
        """The examples' own check of every answer, in order."""
        assert len(int0) == len(int1) == len(string0) == len(VALUES) + 1
        for i in range(len(int0)):
            want0 = 1 if i == 0 else VALUES[i - 1]
            want1 = 101 if i == 0 else -VALUES[i - 1]
            if i == 0:
                want_s = 20 if self.dyna else 21
            elif self.dyna:
                want_s = -VALUES[i - 1] + int(string0[i - 1][0][0])
            else:
                want_s = -VALUES[i - 1]
            if self.dyna and i != 0 and VALUES[i - 1] == 1:
                want0 += self.id0
                want1 += self.id1
                want_s += int(self.string_id)
            got = (int0[i][0][0], int1[i][0][0], string0[i][0][0])
            assert got == (want0, want1, want_s), f"step {i}"


def _request(module: Any, value: int) -> tuple[list[Any], list[Any]]:
    data = np.full(shape=[1, 1], fill_value=value, dtype=np.int32)
    inputs = [module.InferInput("INPUT", data.shape, "INT32")]
    inputs[0].set_data_from_numpy(data)
    return inputs, [module.InferRequestedOutput("OUTPUT")]


def _sync_send(module: Any, client: Any, values: list[int], sequence_id: int | str,
               model: str) -> list[Any]:
    results = []
    for count, value in enumerate(values, start=1):
        inputs, outputs = _request(module, value)
        result = client.infer(model_name=model, inputs=inputs, outputs=outputs,
                              sequence_id=sequence_id, sequence_start=(count == 1),
                              sequence_end=(count == len(values)))
        results.append(result.as_numpy("OUTPUT"))
    return results


@pytest.mark.parametrize("dyna", [False, True], ids=["simple", "dyna"])
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_sequence_sync_infer_client(server: RunningServer, transport: str, dyna: bool) -> None:
    module = httpclient if transport == "http" else grpcclient
    client = module.InferenceServerClient(server.url if transport == "http" else server.grpc_url)
    plan = Plan(dyna, offset=2 if transport == "http" else 4)
    results = [_sync_send(module, client, values, sequence_id, model)
               for sequence_id, values, model in plan.sequences]
    plan.check(*results)


def _sort_answers(plan: Plan, answers: list[Any]) -> list[list[Any]]:
    """The examples' receive loop: each answer to its sequence by its request id."""
    lists: list[list[Any]] = [[], [], []]
    for answer in answers:
        this_id = answer.get_response().id.split("_")[0]
        if this_id == str(plan.id0):
            lists[0].append(answer.as_numpy("OUTPUT"))
        elif this_id == str(plan.id1):
            lists[1].append(answer.as_numpy("OUTPUT"))
        else:
            assert this_id == plan.string_id
            lists[2].append(answer.as_numpy("OUTPUT"))
    return lists


@pytest.mark.parametrize("dyna", [False, True], ids=["simple", "dyna"])
def test_grpc_sequence_stream_infer_client(server: RunningServer, dyna: bool) -> None:
    plan = Plan(dyna, offset=6)
    completed: queue.Queue[Any] = queue.Queue()
    with grpcclient.InferenceServerClient(url=server.grpc_url) as client:
        client.start_stream(callback=partial(lambda q, result, error: q.put(error or result),
                                             completed))
        for sequence_id, values, model in plan.sequences:
            for count, value in enumerate(values, start=1):
                inputs, outputs = _request(grpcclient, value)
                client.async_stream_infer(
                    model_name=model, inputs=inputs, outputs=outputs,
                    request_id=f"{sequence_id}_{count}", sequence_id=sequence_id,
                    sequence_start=(count == 1), sequence_end=(count == len(values)))
        answers = [completed.get(timeout=30) for _ in range(3 * (len(VALUES) + 1))]
    errors = [a for a in answers if isinstance(a, Exception)]
    assert not errors, errors[0]
    plan.check(*_sort_answers(plan, answers))


@pytest.mark.parametrize("dyna", [False, True], ids=["simple", "dyna"])
def test_grpc_aio_sequence_stream_infer_client(server: RunningServer, dyna: bool) -> None:
    import tritonclient.grpc.aio as aiogrpcclient

    plan = Plan(dyna, offset=8)

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for sequence_id, values, model in plan.sequences:
            for count, value in enumerate(values, start=1):
                inputs, outputs = _request(aiogrpcclient, value)
                yield {"model_name": model, "inputs": inputs, "outputs": outputs,
                       "request_id": f"{sequence_id}_{count}", "sequence_id": sequence_id,
                       "sequence_start": count == 1, "sequence_end": count == len(values)}

    async def main() -> list[Any]:
        answers = []
        async with aiogrpcclient.InferenceServerClient(url=server.grpc_url) as client:
            async for result, error in client.stream_infer(inputs_iterator=requests()):
                assert error is None, error
                answers.append(result)
                if len(answers) == 3 * (len(VALUES) + 1):
                    break
        return answers

    plan.check(*_sort_answers(plan, asyncio.run(main())))


@pytest.mark.parametrize("dyna", [False, True], ids=["simple", "dyna"])
def test_http_aio_sequence_sync_infer_client(server: RunningServer, dyna: bool) -> None:
    import tritonclient.http.aio as aiohttpclient

    plan = Plan(dyna, offset=10)

    async def send(client: Any, values: list[int], sequence_id: int | str, model: str
                   ) -> list[Any]:
        results = []
        for count, value in enumerate(values, start=1):
            inputs, outputs = _request(aiohttpclient, value)
            result = await client.infer(model_name=model, inputs=inputs, outputs=outputs,
                                        sequence_id=sequence_id, sequence_start=(count == 1),
                                        sequence_end=(count == len(values)))
            results.append(result.as_numpy("OUTPUT"))
        return results

    async def main() -> list[list[Any]]:
        client = aiohttpclient.InferenceServerClient(server.url)
        try:
            return [await send(client, values, sequence_id, model)
                    for sequence_id, values, model in plan.sequences]
        finally:
            await client.close()

    plan.check(*asyncio.run(main()))
