"""Merging requests' inputs into one batch and splitting the engine's outputs back per request."""

from __future__ import annotations

import numpy as np
import pytest

from serval.batching.tensors import concat_inputs, split_outputs
from serval.errors import BackendError

pytestmark = pytest.mark.unit


def test_concat_of_a_single_request_is_its_own_inputs() -> None:
    inputs = {"x": np.ones((2, 3), np.float32)}
    assert concat_inputs([inputs]) is inputs


def test_concat_stacks_every_input_along_the_batch_axis() -> None:
    parts = [
        {"x": np.full((1, 2), 1.0), "y": np.array([[1]])},
        {"x": np.full((3, 2), 2.0), "y": np.array([[2], [3], [4]])},
    ]
    merged = concat_inputs(parts)
    np.testing.assert_array_equal(merged["x"], [[1, 1], [2, 2], [2, 2], [2, 2]])
    np.testing.assert_array_equal(merged["y"], [[1], [2], [3], [4]])


def test_split_gives_each_request_its_own_rows_of_every_output() -> None:
    outputs = {"a": np.arange(6).reshape(6, 1), "b": np.arange(6) * 10}
    pieces = split_outputs(outputs, [1, 3, 2], "m")
    assert [p["a"].ravel().tolist() for p in pieces] == [[0], [1, 2, 3], [4, 5]]
    assert [p["b"].tolist() for p in pieces] == [[0], [10, 20, 30], [40, 50]]


def test_split_for_a_single_request_returns_the_outputs() -> None:
    outputs = {"a": np.zeros((3, 2))}
    assert split_outputs(outputs, [3], "m") == [outputs]


@pytest.mark.parametrize(("outputs", "fragment"), [
    ({"ok": np.zeros((4, 2)), "bad": np.zeros((1, 2))},
     "model 'broken' returned 1 rows in output 'bad' for a batch of 4"),
    ({"bad": np.zeros((5,))}, "returned 5 rows in output 'bad' for a batch of 4"),
    ({"bad": np.float32(1.0) * np.ones(())}, "returned -1 rows in output 'bad'"),
])
def test_split_rejects_an_engine_row_count_that_does_not_match(
    outputs: dict[str, np.ndarray], fragment: str
) -> None:
    with pytest.raises(BackendError) as caught:
        split_outputs(outputs, [1, 3], "broken")
    assert fragment in caught.value.message
    assert "model 'broken'" in caught.value.message
