"""The classification extension: top classes per batch row as Triton writes them."""

from __future__ import annotations

import numpy as np
import pytest

from serval.errors import InvalidInput
from serval.protocol.classification import class_count, classify

pytestmark = pytest.mark.unit


def test_each_batch_row_gets_its_best_classes_first() -> None:
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], np.float32)
    classes = classify(scores, 2, batched=True)
    assert classes.shape == (2, 2)
    assert classes.tolist() == [[b"0.700000:1", b"0.200000:2"], [b"0.500000:0", b"0.250000:1"]]


def test_labels_are_added_where_the_index_has_one() -> None:
    classes = classify(np.array([[1, 3, 2]], np.int32), 3, batched=True, labels=["a", "b"])
    assert classes.tolist() == [[b"3:1:b", b"2:2", b"1:0:a"]]


def test_an_unbatched_tensor_is_one_row_of_all_its_elements() -> None:
    classes = classify(np.array([[1, 3], [9, 2]], np.uint8), 2, batched=False)
    assert classes.shape == (2,) and classes.tolist() == [b"9:2", b"3:1"]


def test_the_count_is_clamped_and_an_empty_batch_stays_empty() -> None:
    assert classify(np.array([[0.5, 0.25]], np.float64), 5, batched=True).shape == (1, 2)
    assert classify(np.zeros((0, 3), np.float32), 2, batched=True).shape == (0, 2)


def test_unsigned_scores_rank_without_wrapping() -> None:
    classes = classify(np.array([[0, 255, 1]], np.uint8), 2, batched=True)
    assert classes.tolist() == [[b"255:1", b"1:2"]]


@pytest.mark.parametrize("array", [np.array([[True]]), np.array([[b"x"]], dtype=object)])
def test_tensors_without_scores_are_refused(array: np.ndarray) -> None:
    with pytest.raises(InvalidInput, match="unsupported type"):
        classify(array, 1, batched=True, name="out")


@pytest.mark.parametrize("value", [-1, 1.5, "2", True, None])
def test_a_class_count_is_a_non_negative_integer(value: object) -> None:
    with pytest.raises(InvalidInput, match="'classification'"):
        class_count(value, "out")
    assert class_count(3, "out") == 3
