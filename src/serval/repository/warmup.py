"""Warm-up requests, run only when a model's config asks for them (model_warmup in config.pbtxt,
`warmup` in config.yaml), as Triton does: zeros (empty strings) or random values of the given
shape. Serval needs no warm-up of its own: batch times are measured from served batches."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serval.backends.base import LoadedModel
from serval.config import WarmupSample
from serval.errors import ConfigError
from serval.protocol.dtypes import numpy_dtype
from serval.protocol.types import TensorDict


@dataclass(frozen=True, slots=True)
class WarmupRequest:
    """One configured warm-up request and how many times it runs."""

    name: str
    count: int
    inputs: TensorDict


def warmup_requests(samples: list[WarmupSample], batching: bool, seed: int = 0
                    ) -> list[WarmupRequest]:
    """The requests `samples` describe; a batch axis of batch_size leads when batching."""
    rng = np.random.default_rng(seed)
    requests = []
    for sample in samples:
        inputs: TensorDict = {}
        for name, spec in sample.inputs.items():
            shape = ((sample.batch_size,) if batching else ()) + tuple(spec.dims)
            inputs[name] = _array(spec.datatype, shape, spec.data == "random", rng)
        requests.append(WarmupRequest(sample.name, sample.count, inputs))
    return requests


def run_warmup(model: LoadedModel, samples: list[WarmupSample]) -> None:
    """Run each configured request its count of times; ConfigError naming the one that fails."""
    for request in warmup_requests(samples, model.metadata.max_batch_size > 0):
        for _ in range(request.count):
            try:
                model.infer(request.inputs)
            except Exception as exc:
                raise ConfigError(f"model_warmup '{request.name}' failed: {exc}") from exc


def _array(datatype: str, shape: tuple[int, ...], random: bool,
           rng: np.random.Generator) -> np.ndarray:
    if datatype == "BYTES":
        if random:
            texts = [str(v).encode() for v in rng.integers(0, 100, int(np.prod(shape)))]
            return np.array(texts, dtype=object).reshape(shape)
        array = np.empty(shape, dtype=object)
        array.fill(b"")
        return array
    dtype = numpy_dtype(datatype)
    if not random:
        return np.zeros(shape, dtype=dtype)
    if dtype.kind == "f":
        return rng.random(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.integers(0, 100, shape).astype(dtype)
