"""Properties of the REST codec: any bytes give a request or InvalidInput, round trips hold."""

from __future__ import annotations

import contextlib

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from serval.errors import InvalidInput
from serval.protocol.rest_codec import decode_request, encode_response
from serval.protocol.types import InferRequest, InferResponse

pytestmark = pytest.mark.unit
EXAMPLES = settings(max_examples=2000, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@EXAMPLES
@given(st.binary(max_size=512), st.one_of(st.none(), st.integers(-10, 600)))
def test_arbitrary_bytes_never_raise_anything_but_invalid_input(body: bytes,
                                                                header: int | None) -> None:
    with contextlib.suppress(InvalidInput):  # anything else escapes and fails the test
        decode_request(body, header)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
                    | st.floats(allow_nan=False)
                    | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=20)
INPUT = st.fixed_dictionaries({}, optional={
    "name": st.text(max_size=4) | JSON, "datatype": st.sampled_from(["FP32", "INT8", "BYTES",
                                                                     "BOOL", "X"]) | JSON,
    "shape": st.lists(st.integers(-2, 4), max_size=3) | JSON, "data": JSON,
    "parameters": st.fixed_dictionaries({}, optional={"binary_data_size": st.integers(-1, 64)})})


@EXAMPLES
@given(st.fixed_dictionaries({}, optional={"inputs": st.lists(INPUT, max_size=3) | JSON,
                                           "outputs": JSON, "parameters": JSON, "id": JSON}))
def test_arbitrary_json_requests_decode_or_raise_invalid_input(doc: dict[str, object]) -> None:
    with contextlib.suppress(InvalidInput):
        decode_request(orjson.dumps(doc))


NUMERIC = st.sampled_from([np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8,
                           np.uint64, np.bool_, np.float16])


@EXAMPLES
@given(NUMERIC.flatmap(lambda dtype: arrays(dtype, st.tuples(st.integers(1, 4),
                                                               st.integers(1, 5)))),
       st.booleans())
def test_responses_round_trip_through_json_and_binary(array: np.ndarray, binary: bool) -> None:
    if array.dtype.kind == "f":
        array = np.nan_to_num(array, nan=0.0, posinf=1.0, neginf=-1.0)
    body, header = encode_response(InferResponse("m", "1", {"y": array}),
                                   InferRequest({}, binary_output=binary))
    if header is None:
        entry = orjson.loads(body)["outputs"][0]
        back = np.asarray(entry["data"], dtype=array.dtype).reshape(entry["shape"])
    else:
        entry = orjson.loads(body[:header])["outputs"][0]
        back = np.frombuffer(body[header:], dtype=array.dtype.newbyteorder("<")).reshape(
            entry["shape"])
    np.testing.assert_array_equal(back, array)


def test_integers_beyond_64_bits_are_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        decode_request(b'{"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], '
                       b'"data": [123456789012345678901234567890]}]}')
