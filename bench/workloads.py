"""Valid random inputs for a model; pre-encoded as v2 requests by serval.loadtest.workloads.

Tensor specs come from the ONNX file itself, so every server under test gets the same inputs
and every answer can be checked against the engine run in this process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from serval.loadtest.workloads import grpc_requests
from serval.loadtest.workloads import http_requests as infer_requests
from serval.protocol.dtypes import from_onnx_type, numpy_dtype
from serval.protocol.types import TensorSpec

TOKEN_RANGE = 30000  # ids valid for every example vocabulary (minilm 30522, lstm 100000)


@dataclass(frozen=True)
class ModelSpec:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def model_file(repository: Path, model: str) -> Path:
    return repository / model / "1" / "model.onnx"


def max_batch(repository: Path, model: str) -> int:
    """The model's max_batch_size from its config.yaml (128 where none is set, 1 for 0)."""
    config_file = repository / model / "config.yaml"
    config = yaml.safe_load(config_file.read_text()) if config_file.exists() else None
    return int((config or {}).get("max_batch_size", 128) or 1)


def model_spec(onnx_file: Path) -> ModelSpec:
    """Input and output names, types and shapes as the ONNX file declares them."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])

    def specs(args: list[Any]) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec(a.name, from_onnx_type(a.type),
                                tuple(d if isinstance(d, int) else -1 for d in a.shape))
                     for a in args)

    return ModelSpec(specs(session.get_inputs()), specs(session.get_outputs()))


def item_shape(spec: TensorSpec, batch: int) -> list[int]:
    """A concrete shape: `batch` first, 1 for any other free dimension."""
    return [batch, *(d if d > 0 else 1 for d in spec.shape[1:])]


def random_tensor(spec: TensorSpec, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Valid data: token ids in range, an all-ones attention mask, normal floats."""
    shape, dtype = item_shape(spec, batch), numpy_dtype(spec.datatype)
    if spec.name == "attention_mask":
        return np.ones(shape, dtype=dtype)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, TOKEN_RANGE, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def random_feeds(spec: ModelSpec, batch: int, count: int, seed: int = 0
                 ) -> list[dict[str, np.ndarray]]:
    """`count` distinct input sets at one batch size, from a fixed seed."""
    rng = np.random.default_rng(seed)
    return [{t.name: random_tensor(t, batch, rng) for t in spec.inputs} for _ in range(count)]


__all__ = ["grpc_requests", "infer_requests", "item_shape", "model_file", "model_spec",
           "random_feeds", "random_tensor"]
