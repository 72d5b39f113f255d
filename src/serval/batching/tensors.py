"""Merging requests' inputs along the batch axis and handing each its own output rows."""

from __future__ import annotations

import numpy as np

from serval.errors import BackendError
from serval.protocol.types import TensorDict


def concat_inputs(parts: list[TensorDict]) -> TensorDict:
    """One batch from several requests of the same signature (no copy for a single one)."""
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts], axis=0) for name in parts[0]}


def split_outputs(outputs: TensorDict, rows: list[int], model_name: str) -> list[TensorDict]:
    """Slice each output by the requests' row counts; the engine must return sum(rows)."""
    total = sum(rows)
    for name, array in outputs.items():
        got = int(array.shape[0]) if array.ndim else -1
        if got != total:
            raise BackendError(
                f"model '{model_name}' returned {got} rows in output '{name}' "
                f"for a batch of {total}"
            )
    if len(rows) == 1:
        return [outputs]
    pieces: list[TensorDict] = []
    start = 0
    for count in rows:
        end = start + count
        pieces.append({name: array[start:end] for name, array in outputs.items()})
        start = end
    return pieces
