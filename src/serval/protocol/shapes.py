"""Tensor shapes a client may send: bounded rank, dimensions and element count."""

from __future__ import annotations

from collections.abc import Sequence

from serval.errors import InvalidInput, shown

MAX_DIMS = 64  # numpy's own limit, and far beyond any model's rank
MAX_DIM = 2**63 - 1  # an int64, as the v2 protocol carries shapes
# The element count a shape may span, zero-size dimensions left out: beyond it numpy (and the
# engines) cannot even describe an empty array of that shape.
MAX_SPAN = 2**56


def check_shape(shape: Sequence[object], name: str) -> tuple[int, ...]:
    """The shape as a tuple of ints, or InvalidInput saying what was wrong and what is allowed."""
    if len(shape) > MAX_DIMS:
        raise InvalidInput(f"input '{name}': shape has {len(shape)} dimensions; a tensor may "
                           f"have at most {MAX_DIMS}")
    span = 1
    for dim in shape:
        if type(dim) is not int:
            raise InvalidInput(f"input '{name}': shape must be a list of non-negative "
                               f"integers, got {_short(shape)}")
        if dim < 0:
            raise InvalidInput(f"input '{name}': shape {_short(shape)} has a negative "
                               "dimension; a shape is a list of non-negative integers")
        if dim > MAX_DIM:
            raise InvalidInput(f"input '{name}': dimension {dim} is beyond {MAX_DIM} (2**63 - 1), "
                               "the largest a shape may carry")
        if dim:
            span *= dim
    if span > MAX_SPAN:
        raise InvalidInput(f"input '{name}': shape {_short(shape)} spans more than 2**56 "
                           "elements (counting its non-zero dimensions); no tensor can be "
                           "that large")
    return tuple(shape)  # type: ignore[arg-type]


def _short(shape: Sequence[object]) -> str:
    """The shape as a message quotes it: bounded in length and nesting (see `shown`)."""
    return shown(shape if isinstance(shape, list) else list(shape), 200)
