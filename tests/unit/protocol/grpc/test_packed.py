"""Typed gRPC contents read from their packed bytes (or with np.fromiter) equal what
protobuf's container holds, for every field and any values (property tests), and anything
else falls back."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serval.protocol.grpc import grpc_service_pb2 as pb
from serval.protocol.grpc.packed import packed_contents

pytestmark = pytest.mark.unit

_FIELDS = {
    "fp32_contents": (np.float32, st.floats(width=32, allow_nan=False)),
    "fp64_contents": (np.float64, st.floats(allow_nan=False)),
    "int_contents": (np.int32, st.integers(-(2**31), 2**31 - 1)),
    "int64_contents": (np.int64, st.integers(-(2**63), 2**63 - 1)),
    "uint_contents": (np.uint32, st.integers(0, 2**32 - 1)),
    "uint64_contents": (np.uint64, st.integers(0, 2**64 - 1)),
    "bool_contents": (np.bool_, st.booleans()),
}


def _parsed(field: str, values: list[object]) -> pb.InferTensorContents:
    """Contents as the server gets them: serialized by a client, parsed again."""
    contents = pb.InferTensorContents()
    getattr(contents, field).extend(values)
    return pb.InferTensorContents.FromString(contents.SerializeToString())


@pytest.mark.parametrize("field", sorted(_FIELDS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_packed_reads_equal_the_containers(field: str, data: st.DataObject) -> None:
    dtype, elements = _FIELDS[field]
    values = data.draw(st.lists(elements, min_size=1, max_size=300))
    contents = _parsed(field, values)
    packed = packed_contents(contents, field, len(values))
    assert packed is not None
    expected = np.asarray(getattr(contents, field), dtype=dtype)
    assert packed.dtype == expected.dtype
    np.testing.assert_array_equal(packed, expected)


def test_negative_ints_and_the_extremes_of_each_width() -> None:
    ints = [0, -1, 1, -(2**31), 2**31 - 1, 127, 128, -128, 300]
    packed = packed_contents(_parsed("int_contents", ints), "int_contents", len(ints))
    np.testing.assert_array_equal(packed, np.array(ints, np.int32))
    longs = [-(2**63), 2**63 - 1, -1, 0, 2**35]
    packed = packed_contents(_parsed("int64_contents", longs), "int64_contents", len(longs))
    np.testing.assert_array_equal(packed, np.array(longs, np.int64))


def test_floats_but_in_one_packed_field_of_the_count_fall_back() -> None:
    two_fields = pb.InferTensorContents(fp32_contents=[1.0, 2.0], int_contents=[3])
    assert packed_contents(two_fields, "fp32_contents", 2) is None
    assert packed_contents(_parsed("fp32_contents", [1.0, 2.0]), "fp32_contents", 3) is None
    assert packed_contents(_parsed("bytes_contents", [b"a"]), "bytes_contents", 1) is None
    assert packed_contents(pb.InferTensorContents(), "fp32_contents", 0) is None
