"""TensorSpec: one input or output as v2 model metadata lists it."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from serval.protocol.types import TensorSpec

pytestmark = pytest.mark.unit


def test_a_spec_is_listed_as_v2_metadata_lists_a_tensor() -> None:
    spec = TensorSpec("input_ids", "INT64", (-1, 32))
    assert orjson.loads(orjson.dumps(spec.as_dict())) == {
        "name": "input_ids", "datatype": "INT64", "shape": [-1, 32]}


def test_a_spec_is_a_frozen_hashable_value() -> None:
    spec = TensorSpec("x", "FP32", (-1, 8))
    same = TensorSpec("x", "FP32", (-1, 8))
    assert spec == same and len({spec, same}) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "y"  # type: ignore[misc]
