"""Triton's decoupled client examples, call for call, against decoupled Python-backend models
this module builds (tests/triton_decoupled_models.py): the client's
simple_grpc_custom_repeat.py (repeat_int32), python_backend's square_client.py
(square_int32), and the asyncio client's stream_infer."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcclient_aio
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests import triton_decoupled_models as models
from tests.conftest import RunningServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer],
           tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    repository = models.build_all(tmp_path_factory.mktemp("decoupled_examples"))
    return server_factory(repository, "--allow-python-models")


class UserData:
    def __init__(self) -> None:
        self._completed_requests: queue.Queue[Any] = queue.Queue()


def callback(user_data: UserData, result: Any, error: Any) -> None:
    if error:
        user_data._completed_requests.put(error)
    else:
        user_data._completed_requests.put(result)


@pytest.mark.slow
def test_simple_grpc_custom_repeat(server: RunningServer) -> None:
    """simple_grpc_custom_repeat.py with its own values: 10 responses, one a second."""
    model_name = "repeat_int32"
    repeat_count = 10
    data_offset = 100
    delay_time = 1000
    wait_time = 1000
    input_data = np.arange(start=data_offset, stop=data_offset + repeat_count, dtype=np.int32)
    delay_data = (np.ones([repeat_count], dtype=np.uint32)) * delay_time
    wait_data = np.array([wait_time], dtype=np.uint32)
    inputs = [grpcclient.InferInput("IN", [repeat_count], "INT32")]
    inputs[-1].set_data_from_numpy(input_data)
    inputs.append(grpcclient.InferInput("DELAY", [repeat_count], "UINT32"))
    inputs[-1].set_data_from_numpy(delay_data)
    inputs.append(grpcclient.InferInput("WAIT", [1], "UINT32"))
    inputs[-1].set_data_from_numpy(wait_data)
    outputs = [grpcclient.InferRequestedOutput("OUT")]
    result_list = []
    user_data = UserData()
    with grpcclient.InferenceServerClient(url=server.grpc_url) as triton_client:
        triton_client.start_stream(callback=partial(callback, user_data))
        triton_client.async_stream_infer(model_name=model_name, inputs=inputs, outputs=outputs)
        recv_count = 0
        while recv_count < repeat_count:
            data_item = user_data._completed_requests.get(timeout=60)
            assert not isinstance(data_item, InferenceServerException), data_item
            result_list.append(data_item.as_numpy("OUT"))
            recv_count = recv_count + 1
    expected_data = data_offset
    for result in result_list:
        assert len(result) == 1
        assert result[0] == expected_data
        expected_data += 1


@pytest.mark.parametrize("model_name", ["square_int32", "square_int32_x2"])
def test_square_client(server: RunningServer, model_name: str) -> None:
    """python_backend's examples/decoupled/square_client.py: 4, 2, 0 and 1 responses (with
    instance_group count 2 too: its requests spread over two worker processes)."""
    in_values = [4, 2, 0, 1]
    inputs = [grpcclient.InferInput("IN", [1], np_to_triton_dtype(np.int32))]
    outputs = [grpcclient.InferRequestedOutput("OUT")]
    user_data = UserData()
    with grpcclient.InferenceServerClient(url=server.grpc_url) as triton_client:
        triton_client.start_stream(callback=partial(callback, user_data))
        for i in range(len(in_values)):
            in_data = np.array([in_values[i]], dtype=np.int32)
            inputs[0].set_data_from_numpy(in_data)
            triton_client.async_stream_infer(model_name=model_name, inputs=inputs,
                                             request_id=str(i), outputs=outputs)
        recv_count = 0
        expected_count = sum(in_values)
        result_dict: dict[str, list[Any]] = {}
        while recv_count < expected_count:
            data_item = user_data._completed_requests.get(timeout=60)
            assert not isinstance(data_item, InferenceServerException), data_item
            this_id = data_item.get_response().id
            result_dict.setdefault(this_id, []).append((recv_count, data_item))
            recv_count += 1
    for i, value in enumerate(in_values):
        this_id = str(i)
        assert (this_id in result_dict) == (value != 0)
        if value:
            assert len(result_dict[this_id]) == value
            for _, item in result_dict[this_id]:
                np.testing.assert_array_equal(item.as_numpy("OUT"),
                                              np.array([value], dtype=np.int32))


def test_aio_stream_infer(server: RunningServer) -> None:
    """tritonclient.grpc.aio's stream_infer (whose requests may not carry Triton's reserved
    parameters, so no empty final responses): IN 0 answers nothing, IN 3 three responses,
    none of them final (the model ends with the final flag alone)."""
    async def requests() -> AsyncIterator[dict[str, Any]]:
        for value in (0, 3):
            infer_input = grpcclient_aio.InferInput("IN", [1], "INT32")
            infer_input.set_data_from_numpy(np.array([value], dtype=np.int32))
            yield {"model_name": "square_int32", "inputs": [infer_input],
                   "request_id": str(value)}

    async def main() -> list[tuple[str, list[int], bool]]:
        seen: list[tuple[str, list[int], bool]] = []
        async with grpcclient_aio.InferenceServerClient(server.grpc_url) as client:
            async for result, error in client.stream_infer(requests()):
                assert error is None, error
                response = result.get_response()
                seen.append((response.id, result.as_numpy("OUT").tolist(),
                             response.parameters["triton_final_response"].bool_param))
                if len(seen) == 3:
                    break
        return seen

    assert asyncio.run(main()) == [("3", [3], False)] * 3
