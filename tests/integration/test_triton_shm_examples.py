"""Triton's system shared-memory client examples (triton-inference-server/client,
src/python/examples: simple_{http,grpc}_shm_client.py, simple_{http,grpc}_shm_string_client.py
and the aio shm clients), call for call with tritonclient.utils.shared_memory, against the
`simple` and `simple_string` models built locally. Keys carry this process's id so two test
runs on one machine never share an object under /dev/shm."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import triton_examples
from tests.conftest import RunningServer

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
shm = pytest.importorskip("tritonclient.utils.shared_memory")
import tritonclient.grpc.aio as grpc_aio  # noqa: E402
import tritonclient.http.aio as http_aio  # noqa: E402
from tritonclient import utils  # noqa: E402

pytestmark = pytest.mark.integration
TAG = f"_{os.getpid()}"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return triton_examples.build(tmp_path_factory.mktemp("triton-shm-examples"))


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer], repository: Path) -> RunningServer:
    return server_factory(repository)


@pytest.fixture(autouse=True)
def no_objects_left() -> Iterator[None]:
    """Whatever a failing example left under /dev/shm is removed."""
    yield
    for path in Path("/dev/shm").glob(f"*{TAG}"):
        path.unlink(missing_ok=True)


def _client(module: Any, server: RunningServer) -> Any:
    url = server.url if module in (httpclient, http_aio) else server.grpc_url
    return module.InferenceServerClient(url=url)


def _field(output: Any, key: str) -> Any:
    return output[key] if isinstance(output, dict) else getattr(output, key)


def _requested(module: Any, name: str) -> Any:
    if module in (httpclient, http_aio):
        return module.InferRequestedOutput(name, binary_data=True)
    return module.InferRequestedOutput(name)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_simple_shm_client(server: RunningServer, module: Any) -> None:
    """simple_http_shm_client.py / simple_grpc_shm_client.py."""
    triton_client = _client(module, server)
    triton_client.unregister_system_shared_memory()
    triton_client.unregister_cuda_shared_memory()
    input0_data = np.arange(start=0, stop=16, dtype=np.int32)
    input1_data = np.ones(shape=16, dtype=np.int32)
    input_byte_size = input0_data.size * input0_data.itemsize
    output_byte_size = input_byte_size
    shm_op_handle = shm.create_shared_memory_region(
        "output_data", "/output_simple" + TAG, output_byte_size * 2)
    triton_client.register_system_shared_memory(
        "output_data", "/output_simple" + TAG, output_byte_size * 2)
    shm_ip_handle = shm.create_shared_memory_region(
        "input_data", "/input_simple" + TAG, input_byte_size * 2)
    shm.set_shared_memory_region(shm_ip_handle, [input0_data])
    shm.set_shared_memory_region(shm_ip_handle, [input1_data], offset=input_byte_size)
    triton_client.register_system_shared_memory(
        "input_data", "/input_simple" + TAG, input_byte_size * 2)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"),
              module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_shared_memory("input_data", input_byte_size)
    inputs[1].set_shared_memory("input_data", input_byte_size, offset=input_byte_size)
    outputs = [_requested(module, "OUTPUT0"), _requested(module, "OUTPUT1")]
    outputs[0].set_shared_memory("output_data", output_byte_size)
    outputs[1].set_shared_memory("output_data", output_byte_size, offset=output_byte_size)
    results = triton_client.infer(model_name="simple", inputs=inputs, outputs=outputs)
    output0, output1 = results.get_output("OUTPUT0"), results.get_output("OUTPUT1")
    output0_data = shm.get_contents_as_numpy(
        shm_op_handle, utils.triton_to_np_dtype(_field(output0, "datatype")),
        _field(output0, "shape"))
    output1_data = shm.get_contents_as_numpy(
        shm_op_handle, utils.triton_to_np_dtype(_field(output1, "datatype")),
        _field(output1, "shape"), offset=output_byte_size)
    np.testing.assert_array_equal(output0_data[0], input0_data + input1_data)
    np.testing.assert_array_equal(output1_data[0], input0_data - input1_data)
    status = triton_client.get_system_shared_memory_status()
    assert status  # both regions, in the transport's own shape
    triton_client.unregister_system_shared_memory()
    assert len(shm.mapped_shared_memory_regions()) == 2
    shm.destroy_shared_memory_region(shm_ip_handle)
    shm.destroy_shared_memory_region(shm_op_handle)
    assert len(shm.mapped_shared_memory_regions()) == 0


def _strings(values: np.ndarray) -> np.ndarray:
    return np.array([str(x).encode("utf-8") for x in values.flatten()], dtype=object)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_simple_shm_string_client(server: RunningServer, module: Any) -> None:
    """simple_http_shm_string_client.py / simple_grpc_shm_string_client.py."""
    triton_client = _client(module, server)
    triton_client.unregister_system_shared_memory()
    triton_client.unregister_cuda_shared_memory()
    in0, in1 = np.arange(start=0, stop=16, dtype=np.int32), np.ones(shape=16, dtype=np.int32)
    input0_data, input1_data = _strings(in0), _strings(in1)
    expected_sum, expected_diff = _strings(np.add(in0, in1)), _strings(np.subtract(in0, in1))
    input0_serialized = utils.serialize_byte_tensor(input0_data)
    input1_serialized = utils.serialize_byte_tensor(input1_data)
    input0_byte_size = utils.serialized_byte_size(input0_serialized)
    input1_byte_size = utils.serialized_byte_size(input1_serialized)
    output0_byte_size = utils.serialized_byte_size(utils.serialize_byte_tensor(expected_sum))
    output1_byte_size = utils.serialized_byte_size(utils.serialize_byte_tensor(expected_diff))
    handles = {}
    for name, key, size in (("output0_data", "/output0_simple", output0_byte_size),
                            ("output1_data", "/output1_simple", output1_byte_size)):
        handles[name] = shm.create_shared_memory_region(name, key + TAG, size)
        triton_client.register_system_shared_memory(name, key + TAG, size)
    for name, key, size, data in (
            ("input0_data", "/input0_simple", input0_byte_size, input0_serialized),
            ("input1_data", "/input1_simple", input1_byte_size, input1_serialized)):
        handles[name] = shm.create_shared_memory_region(name, key + TAG, size)
        shm.set_shared_memory_region(handles[name], [data])
        triton_client.register_system_shared_memory(name, key + TAG, size)
    inputs = [module.InferInput("INPUT0", [1, 16], "BYTES"),
              module.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_shared_memory("input0_data", input0_byte_size)
    inputs[1].set_shared_memory("input1_data", input1_byte_size)
    outputs = [_requested(module, "OUTPUT0"), _requested(module, "OUTPUT1")]
    outputs[0].set_shared_memory("output0_data", output0_byte_size)
    outputs[1].set_shared_memory("output1_data", output1_byte_size)
    results = triton_client.infer(model_name="simple_string", inputs=inputs, outputs=outputs)
    got = {}
    for name, region in (("OUTPUT0", "output0_data"), ("OUTPUT1", "output1_data")):
        output = results.get_output(name)
        got[name] = shm.get_contents_as_numpy(
            handles[region], utils.triton_to_np_dtype(_field(output, "datatype")),
            _field(output, "shape"))
    assert list(got["OUTPUT0"][0]) == list(expected_sum)
    assert list(got["OUTPUT1"][0]) == list(expected_diff)
    assert triton_client.get_system_shared_memory_status()
    triton_client.unregister_system_shared_memory()
    assert len(shm.mapped_shared_memory_regions()) == 4
    for handle in handles.values():
        shm.destroy_shared_memory_region(handle)
    assert len(shm.mapped_shared_memory_regions()) == 0


@pytest.mark.parametrize("module", [http_aio, grpc_aio], ids=["http-aio", "grpc-aio"])
def test_simple_aio_shm_client(server: RunningServer, module: Any) -> None:
    """simple_http_aio_shm_client.py / simple_grpc_aio_shm_client.py."""

    async def main() -> None:
        triton_client = _client(module, server)
        await triton_client.unregister_system_shared_memory()
        await triton_client.unregister_cuda_shared_memory()
        input0_data = np.arange(start=0, stop=16, dtype=np.int32)
        input1_data = np.ones(shape=16, dtype=np.int32)
        size = input0_data.size * input0_data.itemsize
        shm_op_handle = shm.create_shared_memory_region("output_data",
                                                        "/output_simple" + TAG, size * 2)
        await triton_client.register_system_shared_memory("output_data",
                                                          "/output_simple" + TAG, size * 2)
        shm_ip_handle = shm.create_shared_memory_region("input_data",
                                                        "/input_simple" + TAG, size * 2)
        shm.set_shared_memory_region(shm_ip_handle, [input0_data])
        shm.set_shared_memory_region(shm_ip_handle, [input1_data], offset=size)
        await triton_client.register_system_shared_memory("input_data",
                                                          "/input_simple" + TAG, size * 2)
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"),
                  module.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("input_data", size)
        inputs[1].set_shared_memory("input_data", size, offset=size)
        outputs = [_requested(module, "OUTPUT0"), _requested(module, "OUTPUT1")]
        outputs[0].set_shared_memory("output_data", size)
        outputs[1].set_shared_memory("output_data", size, offset=size)
        results = await triton_client.infer(model_name="simple", inputs=inputs,
                                            outputs=outputs)
        output1 = results.get_output("OUTPUT1")
        output1_data = shm.get_contents_as_numpy(
            shm_op_handle, utils.triton_to_np_dtype(_field(output1, "datatype")),
            _field(output1, "shape"), offset=size)
        np.testing.assert_array_equal(output1_data[0], input0_data - input1_data)
        assert await triton_client.get_system_shared_memory_status()
        await triton_client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(shm_ip_handle)
        shm.destroy_shared_memory_region(shm_op_handle)
        assert len(shm.mapped_shared_memory_regions()) == 0
        await triton_client.close()

    asyncio.run(main())
