"""The isolated engine's wire: tensors cross a pipe as raw bytes and come back equal; requests
and their per-request results cross with what identifies them."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from serval.backends.pipe_requests import recv_requests, recv_results, send_requests, send_results
from serval.backends.pipe_tensors import recv_tensors, send_tensors
from serval.errors import BackendError, EngineRejectedInput
from serval.protocol.types import InferRequest, RequestedOutput

pytestmark = pytest.mark.unit


def test_tensors_round_trip_with_dtype_shape_and_layout() -> None:
    sender, receiver = multiprocessing.Pipe()
    rng = np.random.default_rng(0)
    tensors = {
        "f32": rng.random((3, 4), dtype=np.float32),
        "strided": np.arange(24, dtype=np.int64).reshape(4, 6)[:, ::2],  # not contiguous
        "fp16": np.ones((2, 2, 2), dtype=np.float16),
        "bool": np.array([[True, False]]),
        "empty": np.zeros((0, 5), dtype=np.float32),
        "text": np.array([[b"hello"], [b"\x00bytes"]], dtype=object),
        "scalar": np.array(7, dtype=np.uint8),
    }
    send_tensors(sender, tensors)
    received = recv_tensors(receiver)
    assert list(received) == list(tensors)
    for name, array in tensors.items():
        assert received[name].dtype == array.dtype and received[name].shape == array.shape
        np.testing.assert_array_equal(received[name], array)
        assert received[name].flags.writeable


def test_a_pipe_closed_midway_is_an_eof() -> None:
    sender, receiver = multiprocessing.Pipe()
    sender.send(("tensors", [("x", "<f4", (2, 2))]))
    sender.close()
    with pytest.raises(EOFError):
        recv_tensors(receiver)


def test_requests_cross_with_their_id_parameters_and_outputs() -> None:
    sender, receiver = multiprocessing.Pipe()
    requests = [
        InferRequest({"x": np.arange(3, dtype=np.int32)}, id="a", parameters={"k": [1, "v"]},
                     outputs=[RequestedOutput("y", binary=True)]),
        InferRequest({"s": np.array([b"t"], dtype=object)}),
    ]
    send_requests(sender, requests)
    kind, heads = receiver.recv()
    assert kind == "requests"
    first, second = recv_requests(receiver, heads)
    assert first.id == "a" and first.parameters == {"k": [1, "v"]}
    assert [o.name for o in first.outputs or []] == ["y"]
    np.testing.assert_array_equal(first.inputs["x"], [0, 1, 2])
    assert second.id is None and second.outputs is None and second.inputs["s"][0] == b"t"


def test_each_requests_result_or_error_crosses_back() -> None:
    sender, receiver = multiprocessing.Pipe()
    send_results(sender, [
        {"y": np.ones((1, 2), np.float32)},
        EngineRejectedInput("bad value", "detail"),
        BackendError("no output 'y'"),
        {"y": np.zeros((2, 2), np.float32)},
    ])
    status, statuses = receiver.recv()
    assert status == "ok"
    ok, rejected, failed, last = recv_results(receiver, statuses)
    assert isinstance(ok, dict) and ok["y"].shape == (1, 2)
    assert isinstance(rejected, EngineRejectedInput)
    assert (rejected.message, rejected.detail) == ("bad value", "detail")
    assert isinstance(failed, BackendError) and failed.message == "no output 'y'"
    assert isinstance(last, dict) and last["y"].shape == (2, 2)
