"""The isolated engine's wire: tensors cross a pipe as raw bytes and come back equal."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from serval.backends.isolated import recv_tensors, send_tensors

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
