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

    def as_dict(self) -> dict[str, object]:
        """As v2 model metadata lists a tensor."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for; binary=None follows the request's default; a class
    count > 0 asks for its top classes instead of the tensor (classification extension)."""

    name: str
    binary: bool | None = None
    class_count: int = 0


@dataclass(slots=True)
class InferRequest:
    """A decoded inference request: batch-first numpy inputs plus what to return."""

    inputs: TensorDict
    outputs: list[RequestedOutput] | None = None
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    binary_output: bool = False


@dataclass(slots=True)
class InferResponse:
    """The outputs computed for one request, in the order the model declares them."""

    model_name: str
    model_version: str
    outputs: TensorDict
    id: str | None = None
