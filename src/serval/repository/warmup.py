"""Warm-up requests, run only when a model's config asks for them (model_warmup in config.pbtxt,
`warmup` in config.yaml), as Triton does: zeros (empty strings), random values of the given
shape, or one sample's raw data from a file in the model's `warmup/` folder (Triton's
input_data_file: row-major little-endian values, BYTES as 4-byte length + bytes), repeated over
the batch. Serval needs no warm-up of its own: batch times are measured from served batches."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from serval.backends.base import LoadedModel
from serval.errors import ConfigError
from serval.model_config import WarmupSample
from serval.protocol.dtypes import numpy_dtype
from serval.protocol.types import TensorDict
from serval.repository.data_files import WARMUP_FOLDER, read_sample


@dataclass(frozen=True, slots=True)
class WarmupRequest:
    """One configured warm-up request and how many times it runs."""

    name: str
    count: int
    inputs: TensorDict




def warmup_requests(samples: list[WarmupSample], batching: bool, model_dir: Path,
                    seed: int = 0) -> list[WarmupRequest]:
    """The requests `samples` describe; a batch axis of batch_size leads when batching."""
    rng = np.random.default_rng(seed)
    requests = []
    for sample in samples:
        inputs: TensorDict = {}
        for name, spec in sorted(sample.inputs.items()):  # errors name the same one each time
            shape = ((sample.batch_size,) if batching else ()) + tuple(spec.dims)
            if spec.data == "file":
                where = f"model_warmup '{sample.name}' input '{name}'"
                one = read_sample(model_dir, WARMUP_FOLDER, spec.file or "", spec.datatype,
                                  spec.dims, f"{where}: input_data_file")
                inputs[name] = np.repeat(one[None], sample.batch_size, 0) if batching else one
            else:
                inputs[name] = _array(spec.datatype, shape, spec.data == "random", rng)
        requests.append(WarmupRequest(sample.name, sample.count, inputs))
    return requests


def run_warmup(model: LoadedModel, samples: list[WarmupSample], model_dir: Path) -> None:
    """Run each configured request its count of times; ConfigError naming the one that fails
    (or whose data file is missing or of the wrong size)."""
    for request in warmup_requests(samples, model.metadata.max_batch_size > 0, model_dir):
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
