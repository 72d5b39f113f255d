"""A request checked against the model's metadata before it reaches the runner: input names,
datatypes, shapes and batch size, requested outputs. What every engine may then assume; each
refusal is an InvalidInput naming what was wrong and what the model expects."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from serval.backends.base import ModelMetadata, SameDim
from serval.errors import InvalidInput
from serval.protocol.dtypes import v2_datatype
from serval.protocol.types import InferRequest, TensorSpec


def validate_request(request: InferRequest, metadata: ModelMetadata, model: str) -> None:
    """InvalidInput naming what was wrong and what the model expects."""
    expected = {spec.name: spec for spec in metadata.inputs}
    for name in request.inputs:
        if name not in expected:
            raise InvalidInput(
                f"model '{model}' has no input '{name}'; expected inputs: {_describe(expected)}"
            )
    batch_sizes = set()
    for spec in metadata.inputs:
        array = request.inputs.get(spec.name)
        if array is None:
            if spec.optional:
                continue
            raise InvalidInput(
                f"model '{model}' needs input '{spec.name}' ({spec.datatype} {list(spec.shape)})"
            )
        _check_tensor(array, spec, metadata.max_batch_size)
        if metadata.max_batch_size > 0:
            batch_sizes.add(array.shape[0])
    if len(batch_sizes) > 1:
        raise InvalidInput(f"inputs disagree on the batch size: {sorted(batch_sizes)}")
    for symbol, places in metadata.same_dims:
        _check_same_dim(request, symbol, places)
    _check_requested_outputs(request, metadata, model)


def same_dims(inputs: Iterable[tuple[str, Sequence[object]]], batched: bool
              ) -> tuple[SameDim, ...]:
    """The named free dimensions (a model file's dim_param, given as a str among the dims)
    that more than one (input, axis) carries; `batched`: the batch axis left out (the batch
    size check covers it)."""
    places: dict[str, list[tuple[str, int]]] = {}
    for name, dims in inputs:
        for axis, dim in enumerate(dims):
            if isinstance(dim, str) and dim and not (batched and axis == 0):
                places.setdefault(dim, []).append((name, axis))
    return tuple((symbol, tuple(where)) for symbol, where in places.items() if len(where) > 1)


def _check_same_dim(request: InferRequest, symbol: str,
                    places: tuple[tuple[str, int], ...]) -> None:
    """The inputs' sizes along one named dimension agree (an engine would fail mid-graph,
    or broadcast one against the other)."""
    given = [(name, axis, request.inputs[name].shape[axis]) for name, axis in places
             if name in request.inputs]
    if len({size for _, _, size in given}) > 1:
        sizes = ", ".join(f"'{name}' axis {axis}: {size}" for name, axis, size in given)
        raise InvalidInput(f"inputs disagree on dimension '{symbol}', which the model gives "
                           f"them all: {sizes}")


def _check_tensor(array: Any, spec: TensorSpec, max_batch_size: int) -> None:
    datatype = v2_datatype(array.dtype)
    if datatype != spec.datatype:
        raise InvalidInput(
            f"input '{spec.name}': datatype {datatype} given, model expects {spec.datatype}"
        )
    shape, want = tuple(array.shape), spec.shape
    fits = len(shape) == len(want) and all(w in (-1, s) for s, w in zip(shape, want, strict=True))
    if not fits:
        raise InvalidInput(
            f"input '{spec.name}': shape {list(shape)} given, model expects {list(want)} "
            "(-1 is any size)"
        )
    if max_batch_size > 0 and not 1 <= shape[0] <= max_batch_size:
        raise InvalidInput(
            f"input '{spec.name}': batch size {shape[0]} given, model accepts 1 to {max_batch_size}"
        )


def _check_requested_outputs(request: InferRequest, metadata: ModelMetadata, model: str) -> None:
    if not request.outputs:
        return
    known = {spec.name for spec in metadata.outputs}
    asked: set[str] = set()
    for output in request.outputs:
        if output.name not in known:
            outputs = ", ".join(sorted(known))
            raise InvalidInput(f"model '{model}' has no output '{output.name}'; outputs: {outputs}")
        if output.name in asked:  # (as Triton): which of its places would the answer name?
            raise InvalidInput(f"output '{output.name}' is asked for more than once")
        asked.add(output.name)


def _describe(specs: dict[str, TensorSpec]) -> str:
    return ", ".join(f"{s.name} ({s.datatype} {list(s.shape)})" for s in specs.values())
