"""Tensors through shared memory: the parameters, inputs read from regions (fixed-size without a
copy, BYTES parsed and checked), outputs written with their sizes checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serval.errors import InvalidInput
from serval.protocol.bytes_tensor import encode_bytes_elements
from serval.protocol.shared_memory import SharedMemoryRegistry
from serval.protocol.shm_tensors import resolve_inputs, shared_memory_ref, write_outputs
from serval.protocol.types import (
    InferRequest,
    InferResponse,
    RequestedOutput,
    SharedMemoryInput,
    SharedMemoryRef,
)

pytestmark = pytest.mark.unit


@pytest.fixture
def regions(tmp_path: Path) -> SharedMemoryRegistry:
    (tmp_path / "data").write_bytes(bytes(4096))
    registry = SharedMemoryRegistry(tmp_path)
    registry.register("data", "/data", 0, 4096)
    return registry


def _put(regions: SharedMemoryRegistry, offset: int, raw: bytes) -> None:
    regions.write("data", offset, len(raw), memoryview(raw), "test")


def _request(datatype: str, shape: tuple[int, ...], ref: SharedMemoryRef,
             outputs: list[RequestedOutput] | None = None) -> InferRequest:
    return InferRequest(inputs={}, outputs=outputs, shared_memory_inputs={
        "x": SharedMemoryInput(datatype, shape, ref)})


@pytest.mark.parametrize(("params", "message"), [
    ({"shared_memory_region": "r"}, "needs both"),
    ({"shared_memory_byte_size": 4}, "needs both"),
    ({"shared_memory_offset": 4}, "needs both"),
    ({"shared_memory_region": "", "shared_memory_byte_size": 4}, "region's name"),
    ({"shared_memory_region": 3, "shared_memory_byte_size": 4}, "region's name"),
    ({"shared_memory_region": "r", "shared_memory_byte_size": -1}, "non-negative integer"),
    ({"shared_memory_region": "r", "shared_memory_byte_size": 4.0}, "non-negative integer"),
    ({"shared_memory_region": "r", "shared_memory_byte_size": 4, "shared_memory_offset": True},
     "'shared_memory_offset' must be"),
])
def test_parameters_must_be_complete_and_typed(params: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        shared_memory_ref(params, "input 'x'")


def test_parameters_give_the_window() -> None:
    assert shared_memory_ref({}, "input 'x'") is None
    assert shared_memory_ref({"shared_memory_region": "r", "shared_memory_byte_size": 8},
                             "input 'x'") == SharedMemoryRef("r", 8, 0)


def test_fixed_size_inputs_are_read_from_the_region(regions: SharedMemoryRegistry) -> None:
    values = np.arange(6, dtype=np.float32)
    _put(regions, 64, values.tobytes())
    request = _request("FP32", (2, 3), SharedMemoryRef("data", 24, 64))
    resolve_inputs(regions, request, 6)
    np.testing.assert_array_equal(request.inputs["x"], values.reshape(2, 3))


def test_a_shape_past_the_element_limit_is_refused_before_reading(
        regions: SharedMemoryRegistry) -> None:
    raw = encode_bytes_elements(np.array([b""] * 1_000, dtype=object))
    _put(regions, 0, raw)
    request = _request("BYTES", (1_000,), SharedMemoryRef("data", len(raw)))
    with pytest.raises(InvalidInput, match=r"input 'x': shape \[1000\] has 1000 elements; this "
                                           "server accepts at most 999 per tensor"):
        resolve_inputs(regions, request, 999)
    assert "x" not in request.inputs


def test_the_byte_size_must_match_shape_and_datatype(regions: SharedMemoryRegistry) -> None:
    request = _request("FP32", (2, 3), SharedMemoryRef("data", 20))
    with pytest.raises(InvalidInput, match=r"FP32 shape \[2, 3\] needs 24 bytes, "
                                           "shared_memory_byte_size is 20"):
        resolve_inputs(regions, request, 1 << 20)


def test_bytes_inputs_are_parsed_and_counted(regions: SharedMemoryRegistry) -> None:
    raw = encode_bytes_elements(np.array([b"ab", b"", b"xyz"], dtype=object))
    _put(regions, 0, raw)
    request = _request("BYTES", (1, 3), SharedMemoryRef("data", len(raw)))
    resolve_inputs(regions, request, 1 << 20)
    assert request.inputs["x"].tolist() == [[b"ab", b"", b"xyz"]]
    with pytest.raises(InvalidInput, match="shape needs 4 BYTES elements, got 3"):
        resolve_inputs(regions, _request("BYTES", (4,), SharedMemoryRef("data", len(raw))),
                       1 << 20)
    with pytest.raises(InvalidInput, match="overruns its data"):
        resolve_inputs(regions, _request("BYTES", (3,), SharedMemoryRef("data", len(raw) - 1)),
                       1 << 20)


def test_outputs_are_checked_before_work_and_written_after(
        regions: SharedMemoryRegistry) -> None:
    _put(regions, 0, np.ones(2, np.int32).tobytes())
    outputs = [RequestedOutput("y", shared_memory=SharedMemoryRef("data", 8, 4090))]
    with pytest.raises(InvalidInput, match=r"output 'y'.*runs past the end of region 'data'"):
        resolve_inputs(regions, _request("INT32", (2,), SharedMemoryRef("data", 8), outputs),
                       1 << 20)
    outputs = [RequestedOutput("y", shared_memory=SharedMemoryRef("data", 8, 100)),
               RequestedOutput("z")]
    request = _request("INT32", (2,), SharedMemoryRef("data", 8), outputs)
    resolve_inputs(regions, request, 1 << 20)
    response = InferResponse("m", "1", {"y": np.array([7, -7], np.int32),
                                        "z": np.zeros(1, np.int32)})
    write_outputs(regions, request, response)
    assert np.frombuffer(regions.read("data", 100, 8, "t"), np.int32).tolist() == [7, -7]
    assert response.shared_memory_outputs == {"y": {
        "shared_memory_region": "data", "shared_memory_byte_size": 8,
        "shared_memory_offset": 100}}


def test_an_output_bigger_than_its_window_is_refused(regions: SharedMemoryRegistry) -> None:
    outputs = [RequestedOutput("y", shared_memory=SharedMemoryRef("data", 4))]
    request = InferRequest(inputs={}, outputs=outputs)
    response = InferResponse("m", "1", {"y": np.array([b"long text"], dtype=object)})
    with pytest.raises(InvalidInput, match="output 'y' needs 13 bytes; shared_memory_byte_size "
                                           "is 4"):
        write_outputs(regions, request, response)


def test_big_endian_and_strided_outputs_are_written_as_the_wire_has_them(
        regions: SharedMemoryRegistry) -> None:
    array = np.arange(6, dtype=">i4").reshape(2, 3)[:, ::2]
    outputs = [RequestedOutput("y", shared_memory=SharedMemoryRef("data", 16))]
    request = InferRequest(inputs={}, outputs=outputs)
    write_outputs(regions, request, InferResponse("m", "1", {"y": array}))
    assert np.frombuffer(regions.read("data", 0, 16, "t"), "<i4").tolist() == [0, 2, 3, 5]


def test_a_server_without_shared_memory_refuses_it() -> None:
    with pytest.raises(InvalidInput, match="shared memory is off on this server"):
        resolve_inputs(None, _request("INT32", (1,), SharedMemoryRef("data", 4)), 1 << 20)
    resolve_inputs(None, InferRequest(inputs={}), 1 << 20)  # no shm asked: nothing to do
