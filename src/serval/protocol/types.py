"""Transport-neutral v2 types: a tensor's spec (as model metadata lists it) and what a decoded
request and a response hold."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

TensorDict = dict[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output: v2 datatype and shape (-1 for a free dimension, batch included)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False  # an input a request may leave out (Triton's `optional: true`)

    def as_dict(self) -> dict[str, object]:
        """As v2 model metadata lists a tensor."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True, slots=True)
class SharedMemoryRef:
    """Where a tensor's bytes lie in a registered shared-memory region (Triton's
    shared_memory_region / _offset / _byte_size parameters)."""

    region: str
    byte_size: int
    offset: int = 0


@dataclass(frozen=True, slots=True)
class SharedMemoryInput:
    """An input whose bytes are in shared memory: resolved to a tensor by the data plane."""

    datatype: str
    shape: tuple[int, ...]
    ref: SharedMemoryRef


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for; binary=None follows the request's default; a class
    count > 0 asks for its top classes instead of the tensor (classification extension)."""

    name: str
    binary: bool | None = None
    class_count: int = 0
    shared_memory: SharedMemoryRef | None = None  # written there, not sent


@dataclass(slots=True)
class InferRequest:
    """A decoded inference request: batch-first numpy inputs plus what to return."""

    inputs: TensorDict
    outputs: list[RequestedOutput] | None = None
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    binary_output: bool = False
    shared_memory_inputs: dict[str, SharedMemoryInput] = field(default_factory=dict)
    trace: Any = None  # observability.trace.Trace when this request is sampled for tracing
    # the models whose running batches wait on this request: set by a BLS call (backends/bls.py)
    # and carried by the steps it leads to, never by a client
    waiting_models: frozenset[str] = frozenset()


@dataclass(slots=True)
class InferResponse:
    """The outputs computed for one request, in the order the model declares them."""

    model_name: str
    model_version: str
    outputs: TensorDict
    id: str | None = None
    # outputs written to shared memory: the parameters their answer carries instead of data
    shared_memory_outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
