"""How long one batch-1 call of a model takes, timed on zeros: what tells an engine-bound model
(its calls dominate a request) from an HTTP-bound one. ONNX Runtime's spinning choice and the
`--workers` check both ask it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from serval.backends.base import Model, RequestModel
from serval.protocol.dtypes import numpy_dtype
from serval.protocol.types import TensorDict, TensorSpec

# A model whose batch-1 call takes this long is engine-bound: its calls, not HTTP parsing,
# decide what a request costs. ONNX Runtime turns intra-op spinning on from here
# (backends/onnxruntime.py), and more than one --workers is refused from here (server/workers.py).
ENGINE_BOUND_MS = 2.0
TIMED_CALLS = 3
TIME_LIMIT_S = 0.05  # a slow model decides in one timed call


def zeros_batch1(inputs: Sequence[TensorSpec]) -> dict[str, np.ndarray] | None:
    """Zeros for every input, each free dimension (the batch axis included) 1; None where an
    input is BYTES (no neutral string for an arbitrary model)."""
    feed = {}
    for spec in inputs:
        if spec.datatype == "BYTES":
            return None
        shape = [dim if dim > 0 else 1 for dim in spec.shape]
        feed[spec.name] = np.zeros(shape, dtype=numpy_dtype(spec.datatype))
    return feed


def fastest_call_ms(call: Callable[[], object]) -> float:
    """The fastest of up to TIMED_CALLS timed calls after an untimed first one (allocations,
    kernel selection); fewer once TIME_LIMIT_S is spent. 0.0 where the call raises."""
    try:
        call()
        times: list[float] = []
        while len(times) < TIMED_CALLS and sum(times) < TIME_LIMIT_S:
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
    except Exception:  # a model that refuses zeros is simply not timed
        return 0.0
    return min(times) * 1e3


def batch1_infer_ms(model: Model) -> float:
    """One batch-1 call of a loaded engine model on zeros, in ms; 0.0 where it cannot be timed
    that way (no `infer`: a pipeline; string inputs; a model that takes its requests one by
    one; zeros refused)."""
    infer: Callable[[TensorDict], TensorDict] | None = getattr(model, "infer", None)
    if infer is None or isinstance(model, RequestModel):
        return 0.0
    feed = zeros_batch1(model.metadata.inputs)
    if feed is None:
        return 0.0
    return fastest_call_ms(lambda: infer(feed))
