"""The REST codec under hostile bodies: JSON nested as deep as the parser allows, values of the
wrong JSON type (booleans among numbers, strings for flags), and errors found late in huge
tensors. Each is a precise InvalidInput, found in work bounded by what the shape declares or in
C-speed passes, never a RecursionError (a 500) and never a Python step per element."""

from __future__ import annotations

import struct
import sys
from typing import Any

import orjson
import pytest

from serval.errors import InvalidInput
from serval.protocol.bytes_tensor import decode_bytes_elements
from serval.protocol.rest_codec import decode_request

pytestmark = pytest.mark.unit


def _body(*inputs: dict[str, Any], **top: Any) -> bytes:
    return orjson.dumps({"inputs": list(inputs), **top})


def _tensor(datatype: str, shape: Any, data: Any) -> dict[str, Any]:
    return {"name": "x", "datatype": datatype, "shape": shape, "data": data}


def _refusal(body: bytes, header_length: int | None = None) -> str:
    with pytest.raises(InvalidInput) as caught:
        decode_request(body, header_length)
    return caught.value.message


def _raw(datatype: str, shape: str, data: str) -> bytes:
    """A body written as text: orjson.dumps refuses to write what nests past 255 levels."""
    return ('{"inputs": [{"name": "x", "datatype": "' + datatype + '", "shape": ' + shape
            + ', "data": ' + data + "}]}").encode()


def _deep(levels: int, leaf: str) -> str:
    return "[" * levels + leaf + "]" * levels


# --- nesting -----------------------------------------------------------------------------------

@pytest.mark.parametrize("levels", [65, 1000, 1020])  # 1020: orjson's limit, with the rest
def test_bytes_data_nested_beyond_any_tensor_is_refused(levels: int) -> None:
    body = _raw("BYTES", "[1, 1]", _deep(levels, '"a"'))
    assert _refusal(body) == ("input 'x': 'data' nests lists more than 64 deep; a tensor has "
                              "at most 64 dimensions")


def test_number_data_nested_1000_deep_is_refused() -> None:
    body = _raw("FP32", "[1]", _deep(1000, "1"))
    assert "not valid FP32" in _refusal(body)


def test_a_shape_nested_1000_deep_is_refused_with_a_short_quote() -> None:
    body = _raw("FP32", _deep(1000, "1"), "[1]")
    message = _refusal(body)
    assert message.startswith("input 'x': shape must be a list of non-negative integers, got "
                              "[[[[")
    assert len(message) < 300


def test_a_shape_of_the_wrong_type_nested_deep_is_quoted_briefly() -> None:
    body = _raw("FP32", '{"a": ' + _deep(1000, "1") + "}", "[1]")
    assert "'shape' must be a list of non-negative integers, got {'a': [[[" in _refusal(body)


def test_nested_bytes_data_within_the_shape_still_decodes() -> None:
    request = decode_request(_body(_tensor("BYTES", [1, 2, 2], [[["a", "b"], ["c", "d"]]])))
    assert request.inputs["x"].tolist() == [[[b"a", b"b"], [b"c", b"d"]]]


# --- JSON types --------------------------------------------------------------------------------

@pytest.mark.parametrize(("datatype", "data", "message"), [
    ("FP32", [True, 0.5], "FP32 data must be numbers, got True (element 0)"),
    ("FP32", [0.5, False], "FP32 data must be numbers, got False (element 1)"),
    ("FP64", [[0.0, 1.0], [True, 2.0]], "FP64 data must be numbers, got True (element 2)"),
    ("INT32", [1, 2, False], "INT32 data must be numbers (integers), got False (element 2)"),
    ("UINT64", [1, 2**64 - 1, True],
     "UINT64 data must be integers in [0, 2**64), got True (element 2)"),
    ("UINT8", [0, True], "UINT8 data must be numbers (integers), got True (element 1)"),
    ("BOOL", [True, 1], "BOOL data must be true/false values, got 1 (element 1)"),
    ("FP32", [0.5, "1.0"], "FP32 data must be numbers, got '1.0' (element 1)"),
    ("FP32", [0.5, None], "FP32 data must be numbers, got None (element 1)"),
    ("FP32", [0.5, {"a": 1}], "FP32 data must be numbers, got {'a': 1} (element 1)"),
    ("UINT64", [1, 2**64 - 1, -1],
     "UINT64 data must be integers in [0, 2**64), got -1 (element 2)"),
    ("BYTES", ["a", "b", 3], "BYTES data must be strings, got 3 (element 2)"),
])
def test_a_value_of_the_wrong_json_type_is_named_with_its_place(
        datatype: str, data: list[Any], message: str) -> None:
    body = _body(_tensor(datatype, [len(data)] if datatype != "FP64" else [2, 2], data))
    assert _refusal(body) == f"input 'x': {message}"


@pytest.mark.parametrize(("datatype", "data"), [
    ("FP32", [0, 1, 0.5, 1.0]), ("INT8", [0, 1, -1, 1]), ("UINT64", [0, 1, 2**64 - 1, 1]),
    ("BOOL", [True, False, True, True]),
])
def test_zeros_and_ones_that_are_numbers_are_taken(datatype: str, data: list[Any]) -> None:
    request = decode_request(_body(_tensor(datatype, [4], data)))
    assert request.inputs["x"].tolist() == data


def test_a_null_after_many_numbers_is_named_without_a_python_step_per_element() -> None:
    """The offender is found by C-speed passes: the Python calls made while refusing do not
    grow with the tensor (a numpy call per element, what it was, made 200,000 here)."""
    count = 200_000
    body = b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [%d], "data": [%snull]}]}' % (
        count + 1, b"0," * count)
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        calls += event in ("call", "c_call")

    sys.setprofile(profile)
    try:
        message = _refusal(body)
    finally:
        sys.setprofile(None)
    assert message == f"input 'x': FP32 data must be numbers, got None (element {count})"
    assert calls < 2_000, calls


@pytest.mark.parametrize(("parameters", "message"), [
    ({"binary_data_output": "false"},
     "request parameter 'binary_data_output' must be a JSON boolean (true or false), "
     "got 'false'"),
    ({"binary_data_output": 0}, "'binary_data_output' must be a JSON boolean"),
    ({"binary_data_output": []}, "'binary_data_output' must be a JSON boolean"),
])
def test_binary_data_output_must_be_a_json_boolean(parameters: dict[str, Any],
                                                   message: str) -> None:
    assert message in _refusal(_body(_tensor("FP32", [1], [0.5]), parameters=parameters))


@pytest.mark.parametrize("value", ["no", "true", 1, {"x": 1}])
def test_an_outputs_binary_data_must_be_a_json_boolean(value: Any) -> None:
    outputs = [{"name": "y", "parameters": {"binary_data": value}}]
    assert _refusal(_body(_tensor("FP32", [1], [0.5]), outputs=outputs)).startswith(
        "output 'y' parameter 'binary_data' must be a JSON boolean (true or false), got ")


def test_json_booleans_still_choose_binary_outputs() -> None:
    request = decode_request(_body(_tensor("FP32", [1], [0.5]),
                                   parameters={"binary_data_output": True},
                                   outputs=[{"name": "y", "parameters": {"binary_data": False}}]))
    assert request.binary_output is True
    assert request.outputs is not None and request.outputs[0].binary is False


# --- element counts ----------------------------------------------------------------------------

def test_json_bytes_beyond_the_shape_are_refused_before_they_are_encoded() -> None:
    body = _body(_tensor("BYTES", [1, 1], ["a"] * 100_000))
    assert _refusal(body) == "input 'x': shape [1, 1] needs 1 elements, 'data' has more than 1"


def test_nested_json_bytes_beyond_the_shape_stop_at_the_first_extra_element() -> None:
    body = _body(_tensor("BYTES", [2], [["a"], ["b"], ["c"] * 100_000]))
    assert _refusal(body) == "input 'x': shape [2] needs 2 elements, 'data' has more than 2"


def test_binary_bytes_elements_beyond_the_shape_stop_at_the_first_extra_one() -> None:
    raw = memoryview(struct.pack("<I", 1) + b"a" + b"\0\0\0\0" * 4_000_000)  # 4M empty ones
    with pytest.raises(InvalidInput) as caught:
        decode_bytes_elements(raw, 1, "text")
    assert caught.value.message == (
        "input 'text': shape needs 1 BYTES elements, got more than 1 (16000000 bytes of data "
        "remain after element 1)")


def test_binary_bytes_elements_of_the_declared_count_decode() -> None:
    raw = memoryview(struct.pack("<I", 1) + b"a" + struct.pack("<I", 0))
    assert decode_bytes_elements(raw, 2, "text").tolist() == [b"a", b""]
    with pytest.raises(InvalidInput, match="needs 3 BYTES elements, got 2"):
        decode_bytes_elements(raw, 3, "text")
