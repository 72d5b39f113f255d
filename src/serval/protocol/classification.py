"""Triton's classification extension: an output asked for with a class count comes back as the
top N of each batch row, BYTES "score:index" or "score:index:label" strings, best first."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from serval.errors import InvalidInput
from serval.protocol.dtypes import v2_datatype

_SCORED_KINDS = "iuf"  # BOOL and BYTES have no scores to rank (Triton refuses them too)


def classify(array: np.ndarray, count: int, batched: bool,
             labels: Sequence[str] | None = None, name: str = "") -> np.ndarray:
    """The top `count` classes of each row (batched: axis 0 is the batch, every other axis
    is flattened into the classes; else the whole tensor is one row): shape [rows, k] (or
    [k]) with k = min(count, classes). Ties keep the lower index first. A label is added
    where `labels` has one for the index. InvalidInput for a tensor with no scores."""
    if array.dtype.kind not in _SCORED_KINDS:
        raise InvalidInput(f"output '{name}': class result not available for output due to "
                           f"unsupported type '{v2_datatype(array.dtype)}'")
    if batched and array.ndim:
        rows = array.reshape(array.shape[0], int(np.prod(array.shape[1:], dtype=np.int64)))
    else:
        rows = array.reshape(1, -1)
    k = min(count, rows.shape[1])
    result = np.empty((rows.shape[0], k), dtype=object)
    for row_index, row in enumerate(rows):
        for column, index in enumerate(_best_first(row)[:k]):
            result[row_index, column] = _entry(row[index], int(index), labels)
    return result if batched and array.ndim else result.reshape(k)


def _best_first(row: np.ndarray) -> np.ndarray:
    """Indexes by descending score, ties by ascending index (no negation: unsigned wraps)."""
    reversed_order = np.argsort(row[::-1], kind="stable")[::-1]
    return np.asarray(len(row) - 1 - reversed_order)


def _entry(score: np.generic, index: int, labels: Sequence[str] | None) -> bytes:
    text = f"{score:f}" if isinstance(score, np.floating) else str(int(score))  # as C++'s
    entry = f"{text}:{index}"  # std::to_string, which Triton's strings are made with
    if labels is not None and index < len(labels) and labels[index]:
        entry += f":{labels[index]}"
    return entry.encode()


def class_count(value: object, output: str) -> int:
    """The `classification` parameter of a requested output: a count >= 0 (0: the raw tensor)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"output '{output}': parameter 'classification' must be a "
                           "non-negative integer (the number of classes to return)")
    return value
