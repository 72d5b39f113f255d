"""Warm-up inputs for a freshly loaded model: zeros of a valid shape, one row where batched."""

from __future__ import annotations

import numpy as np

from serval.backends.base import ModelMetadata
from serval.protocol.dtypes import numpy_dtype
from serval.protocol.types import TensorDict


def warmup_inputs(metadata: ModelMetadata) -> TensorDict:
    """One valid request's inputs (free dimensions become 1)."""
    inputs: TensorDict = {}
    for spec in metadata.inputs:
        shape = tuple(1 if dim < 0 else dim for dim in spec.shape)
        if spec.datatype == "BYTES":
            array = np.empty(shape, dtype=object)
            array.fill(b"")
        else:
            array = np.zeros(shape, dtype=numpy_dtype(spec.datatype))
        inputs[spec.name] = array
    return inputs
