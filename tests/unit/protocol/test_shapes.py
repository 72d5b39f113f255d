"""Requested tensor shapes: hostile shapes refused with the limit they break; the largest
allowed pass."""

from __future__ import annotations

import pytest

from serval.errors import InvalidInput
from serval.protocol.shapes import check_shape

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("shape", "expected"), [
    ([1] * 65, "65 dimensions; a tensor may have at most 64"),
    ([0, 2**63], "beyond 9223372036854775807"),
    ([0, -1], "negative dimension"),
    ([0, 2**40, 2**40], "spans more than 2**56 elements"),
    ([1.0], "list of non-negative integers"),
    ([True], "list of non-negative integers"),
])
def test_hostile_shapes_are_refused_with_the_limit(shape: list[object], expected: str) -> None:
    with pytest.raises(InvalidInput, match=expected.replace("*", r"\*")):
        check_shape(shape, "x")


def test_the_largest_allowed_shapes_pass() -> None:
    assert check_shape([1] * 64, "x") == (1,) * 64
    assert check_shape([0, 2**56], "x") == (0, 2**56)
    assert check_shape([2**28, 2**28], "x") == (2**28, 2**28)


def test_a_nested_shape_is_quoted_briefly() -> None:
    deep: list[object] = [1]
    for _ in range(1000):
        deep = [deep]
    with pytest.raises(InvalidInput) as caught:
        check_shape([2, deep], "x")  # repr() of it raises RecursionError
    assert caught.value.message.startswith("input 'x': shape must be a list of non-negative "
                                           "integers, got [2, [[[")
