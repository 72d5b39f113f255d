"""KServe v2 REST codec: JSON and binary tensor decoding, response encoding, malformed bodies."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from serval.errors import InvalidInput
from serval.protocol.rest_codec import decode_request, encode_response
from serval.protocol.types import InferRequest, InferResponse, RequestedOutput

pytestmark = pytest.mark.unit

# Four values per datatype, including each type's extremes, decoded as shape [2, 2].
JSON_VALUES: dict[str, tuple[list[Any], str]] = {
    "BOOL": ([True, False, False, True], "bool"),
    "UINT8": ([0, 1, 254, 255], "<u1"),
    "UINT16": ([0, 1, 300, 65535], "<u2"),
    "UINT32": ([0, 1, 70000, 2**32 - 1], "<u4"),
    "UINT64": ([0, 1, 2**40, 2**64 - 1], "<u8"),
    "INT8": ([-128, -1, 0, 127], "<i1"),
    "INT16": ([-32768, -1, 0, 32767], "<i2"),
    "INT32": ([-(2**31), -1, 0, 2**31 - 1], "<i4"),
    "INT64": ([-(2**63), -1, 0, 2**63 - 1], "<i8"),
    "FP16": ([0.5, -1.25, 0.0, 1024.0], "<f2"),
    "FP32": ([0.1, -2.5, 3.0e30, 0.0], "<f4"),
    "FP64": ([0.1, -2.5, 1.0e300, 5e-324], "<f8"),
}
NUMERIC = list(JSON_VALUES)


def request_body(*inputs: dict[str, Any], **top: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **top}).encode()


def with_binary(doc: dict[str, Any], *chunks: bytes) -> tuple[bytes, int]:
    """A body with a JSON header followed by binary chunks, and the header's length."""
    header = json.dumps(doc).encode()
    return header + b"".join(chunks), len(header)


def length_prefixed(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def sample(datatype: str) -> np.ndarray:
    """A [2, 3] array of the datatype with distinct values (negative ones where signed)."""
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    offset = 0 if datatype.startswith("UINT") else -2
    return (np.arange(6).reshape(2, 3) * 3 + offset).astype(JSON_VALUES[datatype][1])


# --- JSON inputs -------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["flat", "nested"])
@pytest.mark.parametrize("datatype", NUMERIC)
def test_json_input_of_every_numeric_datatype(datatype: str, layout: str) -> None:
    values, dtype = JSON_VALUES[datatype]
    data = values if layout == "flat" else [values[:2], values[2:]]
    request = decode_request(
        request_body({"name": "x", "datatype": datatype, "shape": [2, 2], "data": data})
    )
    array = request.inputs["x"]
    assert array.dtype == np.dtype(dtype)
    assert array.shape == (2, 2)
    np.testing.assert_array_equal(array, np.array(values, dtype=dtype).reshape(2, 2))


@pytest.mark.parametrize("layout", ["flat", "nested"])
def test_json_bytes_input_becomes_utf8_bytes(layout: str) -> None:
    values = ["a", "", "été", "日本"]
    data = values if layout == "flat" else [values[:2], values[2:]]
    request = decode_request(
        request_body({"name": "s", "datatype": "BYTES", "shape": [2, 2], "data": data})
    )
    array = request.inputs["s"]
    assert array.dtype == object and array.shape == (2, 2)
    assert array.ravel().tolist() == [v.encode() for v in values]


def test_json_empty_tensor() -> None:
    request = decode_request(
        request_body({"name": "x", "datatype": "FP32", "shape": [0, 3], "data": []})
    )
    assert request.inputs["x"].shape == (0, 3) and request.inputs["x"].dtype == np.float32


def test_request_defaults_when_only_inputs_are_given() -> None:
    request = decode_request(request_body({"name": "x", "datatype": "INT32", "shape": [1],
                                           "data": [7]}))
    assert request.id is None
    assert request.outputs is None
    assert request.parameters == {}
    assert request.binary_output is False


def test_request_id_parameters_and_requested_outputs() -> None:
    request = decode_request(request_body(
        {"name": "x", "datatype": "INT32", "shape": [1], "data": [7]},
        id="req-42",
        parameters={"binary_data_output": True, "priority": 3},
        outputs=[
            {"name": "a", "parameters": {"binary_data": False}},
            {"name": "b", "parameters": {"binary_data": True}},
            {"name": "c"},
        ],
    ))
    assert request.id == "req-42"
    assert request.parameters == {"binary_data_output": True, "priority": 3}
    assert request.binary_output is True
    assert request.outputs == [
        RequestedOutput("a", False), RequestedOutput("b", True), RequestedOutput("c", None)
    ]


# --- binary inputs -----------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", NUMERIC)
def test_binary_input_of_every_numeric_datatype(datatype: str) -> None:
    array = sample(datatype)
    raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
    body, header_length = with_binary({"inputs": [{
        "name": "x", "datatype": datatype, "shape": [2, 3],
        "parameters": {"binary_data_size": len(raw)},
    }]}, raw)
    decoded = decode_request(body, header_length).inputs["x"]
    assert decoded.dtype == np.dtype(JSON_VALUES[datatype][1])
    np.testing.assert_array_equal(decoded, array)


def test_binary_bytes_input_is_length_prefixed() -> None:
    elements = [b"abc", b"", b"\xff\x00raw"]
    raw = length_prefixed(*elements)
    body, header_length = with_binary({"inputs": [{
        "name": "s", "datatype": "BYTES", "shape": [3, 1],
        "parameters": {"binary_data_size": len(raw)},
    }]}, raw)
    decoded = decode_request(body, header_length).inputs["s"]
    assert decoded.shape == (3, 1)
    assert decoded.ravel().tolist() == elements


def test_mixed_json_and_binary_inputs_consume_binary_in_input_order() -> None:
    first = np.array([[1.5, -2.0]], dtype=np.float32)
    second = np.array([10, 20, 30], dtype=np.int64)
    words = length_prefixed(b"hi", b"there")
    body, header_length = with_binary({"id": "mixed", "inputs": [
        {"name": "first", "datatype": "FP32", "shape": [1, 2],
         "parameters": {"binary_data_size": first.nbytes}},
        {"name": "json", "datatype": "INT8", "shape": [2], "data": [-1, 1]},
        {"name": "words", "datatype": "BYTES", "shape": [2],
         "parameters": {"binary_data_size": len(words)}},
        {"name": "second", "datatype": "INT64", "shape": [3],
         "parameters": {"binary_data_size": second.nbytes}},
    ]}, first.tobytes(), words, second.tobytes())
    request = decode_request(body, header_length)
    assert list(request.inputs) == ["first", "json", "words", "second"]
    np.testing.assert_array_equal(request.inputs["first"], first)
    np.testing.assert_array_equal(request.inputs["json"], np.array([-1, 1], dtype=np.int8))
    assert request.inputs["words"].tolist() == [b"hi", b"there"]
    np.testing.assert_array_equal(request.inputs["second"], second)
    assert request.id == "mixed"


# --- responses ---------------------------------------------------------------------------------


def test_json_response_flattens_data_and_keeps_order_and_id() -> None:
    response = InferResponse("m", "3", {
        "probs": np.array([[0.25, 0.75], [1.0, 0.0]], dtype=np.float32),
        "label": np.array([[2], [-7]], dtype=np.int64),
        "ok": np.array([True, False]),
    }, id="abc")
    body, header_length = encode_response(response, InferRequest(inputs={}))
    assert header_length is None
    doc = json.loads(body)
    assert doc["model_name"] == "m" and doc["model_version"] == "3" and doc["id"] == "abc"
    assert doc["outputs"] == [
        {"name": "probs", "datatype": "FP32", "shape": [2, 2], "data": [0.25, 0.75, 1.0, 0.0]},
        {"name": "label", "datatype": "INT64", "shape": [2, 1], "data": [2, -7]},
        {"name": "ok", "datatype": "BOOL", "shape": [2], "data": [True, False]},
    ]


def test_response_without_id_has_no_id_key() -> None:
    body, _ = encode_response(InferResponse("m", "1", {"y": np.zeros(1, np.float32)}),
                              InferRequest(inputs={}))
    assert "id" not in json.loads(body)


@pytest.mark.parametrize("datatype", NUMERIC)
def test_json_response_round_trips_every_numeric_datatype(datatype: str) -> None:
    array = sample(datatype)
    body, _ = encode_response(InferResponse("m", "1", {"y": array}), InferRequest(inputs={}))
    (entry,) = json.loads(body)["outputs"]
    assert entry["datatype"] == datatype and entry["shape"] == [2, 3]
    np.testing.assert_array_equal(np.array(entry["data"], dtype=array.dtype).reshape(2, 3), array)


@pytest.mark.parametrize("datatype", NUMERIC)
def test_binary_response_round_trips_every_numeric_datatype(datatype: str) -> None:
    array = sample(datatype)
    request = InferRequest(inputs={}, binary_output=True)
    body, header_length = encode_response(InferResponse("m", "1", {"y": array}), request)
    assert header_length is not None
    doc = json.loads(body[:header_length])
    (entry,) = doc["outputs"]
    assert "data" not in entry
    size = entry["parameters"]["binary_data_size"]
    assert size == array.nbytes == len(body) - header_length
    decoded = np.frombuffer(body[header_length:], dtype=array.dtype.newbyteorder("<"))
    np.testing.assert_array_equal(decoded.reshape(entry["shape"]), array)


@pytest.mark.parametrize("array", [
    np.arange(6, dtype=np.float32).reshape(2, 3).T,  # not C-contiguous
    np.arange(4, dtype=">f4"),  # big-endian
    np.arange(4, dtype=">i8")[::2],  # big-endian and strided
], ids=["transposed", "big-endian", "big-endian-strided"])
def test_binary_response_is_little_endian_row_major(array: np.ndarray) -> None:
    body, header_length = encode_response(InferResponse("m", "1", {"y": array}),
                                          InferRequest(inputs={}, binary_output=True))
    assert header_length is not None
    (entry,) = json.loads(body[:header_length])["outputs"]
    assert entry["shape"] == list(array.shape)
    little = array.dtype.newbyteorder("<")
    assert body[header_length:] == np.ascontiguousarray(array, dtype=little).tobytes()


def test_per_output_binary_flags_override_the_request_default() -> None:
    a = np.array([1.0, 2.0], dtype=np.float32)
    b = np.array([3, 4], dtype=np.int32)
    c = np.array([5.0], dtype=np.float64)
    request = InferRequest(
        inputs={}, binary_output=True,
        outputs=[RequestedOutput("a", False), RequestedOutput("b", None)],
    )
    body, header_length = encode_response(InferResponse("m", "1", {"a": a, "b": b, "c": c}),
                                          request)
    assert header_length is not None
    entries = {e["name"]: e for e in json.loads(body[:header_length])["outputs"]}
    assert entries["a"]["data"] == [1.0, 2.0]
    assert entries["b"]["parameters"] == {"binary_data_size": 8}
    assert entries["c"]["parameters"] == {"binary_data_size": 8}
    binary = body[header_length:]
    assert len(binary) == 16
    np.testing.assert_array_equal(np.frombuffer(binary[:8], "<i4"), b)
    np.testing.assert_array_equal(np.frombuffer(binary[8:], "<f8"), c)


def test_one_binary_output_in_an_otherwise_json_response() -> None:
    a = np.array([[1.0, 2.0]], dtype=np.float32)
    request = InferRequest(inputs={}, outputs=[RequestedOutput("a", True)])
    body, header_length = encode_response(
        InferResponse("m", "1", {"a": a, "b": np.array([9], np.int8)}), request
    )
    assert header_length is not None
    entries = {e["name"]: e for e in json.loads(body[:header_length])["outputs"]}
    assert entries["b"]["data"] == [9]
    np.testing.assert_array_equal(np.frombuffer(body[header_length:], "<f4").reshape(1, 2), a)


def test_bytes_output_as_json_strings() -> None:
    array = np.array([[b"hi", "text"], ["été".encode(), b"\xff"]], dtype=object)
    body, header_length = encode_response(InferResponse("m", "1", {"s": array}),
                                          InferRequest(inputs={}))
    assert header_length is None
    (entry,) = json.loads(body)["outputs"]
    assert entry["datatype"] == "BYTES" and entry["shape"] == [2, 2]
    assert entry["data"] == ["hi", "text", "été", "\ufffd"]


def test_bytes_output_as_binary_is_length_prefixed() -> None:
    array = np.array([b"ab", "é", b""], dtype=object)
    body, header_length = encode_response(InferResponse("m", "1", {"s": array}),
                                          InferRequest(inputs={}, binary_output=True))
    assert header_length is not None
    (entry,) = json.loads(body[:header_length])["outputs"]
    expected = length_prefixed(b"ab", "é".encode(), b"")
    assert entry["datatype"] == "BYTES"
    assert entry["parameters"]["binary_data_size"] == len(expected)
    assert body[header_length:] == expected


# --- malformed requests ------------------------------------------------------------------------

FP32_X = {"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}


@pytest.mark.parametrize(("body", "fragment"), [
    (b"{not json", "not valid JSON"),
    (b"", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'"inputs"', "must be a JSON object"),
    (b"{}", "non-empty 'inputs' list"),
    (b'{"inputs": []}', "non-empty 'inputs' list"),
    (b'{"inputs": {"name": "x"}}', "non-empty 'inputs' list"),
    (request_body(42), "each input must be a JSON object"),
    (request_body({"datatype": "FP32", "shape": [1], "data": [1]}), "no 'name'"),
    (request_body({"name": "", "datatype": "FP32", "shape": [1], "data": [1]}), "no 'name'"),
    (request_body({"name": "x", "shape": [1], "data": [1]}), "'datatype' must be a string"),
    (request_body({"name": "x", "datatype": "FP32", "data": [1]}), "'shape' must be a list"),
    (request_body({"name": "x", "datatype": "FP8", "shape": [1], "data": [1]}),
     "unknown datatype 'FP8'"),
    (request_body({"name": "x", "datatype": "fp32", "shape": [1], "data": [1]}),
     "unknown datatype 'fp32'"),
    (request_body({"name": "x", "datatype": "FP32", "shape": [-1], "data": [1]}),
     "non-negative integers"),
    (request_body({"name": "x", "datatype": "FP32", "shape": [1.5], "data": [1]}),
     "non-negative integers"),
    (request_body({"name": "x", "datatype": "FP32", "shape": ["2"], "data": [1, 2]}),
     "non-negative integers"),
    (request_body({"name": "x", "datatype": "FP32", "shape": [True], "data": [1]}),
     "non-negative integers"),
    (request_body({"name": "x", "datatype": "FP32", "shape": [2, 2], "data": [1, 2, 3]}),
     "needs 4 elements, 'data' has 3"),
    (request_body({"name": "x", "datatype": "BYTES", "shape": [3], "data": ["a"]}),
     "needs 3 elements, 'data' has 1"),
    (request_body({"name": "x", "datatype": "FP32", "shape": [1], "data": ["1.0"]}),
     "FP32 data must be numbers"),
    (request_body({"name": "x", "datatype": "INT32", "shape": [1], "data": [True]}),
     "INT32 data must be numbers"),
    (request_body({"name": "x", "datatype": "UINT8", "shape": [2], "data": [1, 300]}),
     "not valid UINT8"),
    (request_body({"name": "x", "datatype": "UINT8", "shape": [1], "data": [-1]}),
     "not valid UINT8"),
    (request_body({"name": "x", "datatype": "FP32", "shape": [2], "data": [[1], 2]}),
     "not valid FP32"),
    (request_body({"name": "x", "datatype": "FP32", "shape": [1], "data": 1.0}),
     "'data' must be a JSON list"),
    (request_body({"name": "x", "datatype": "BYTES", "shape": [1], "data": [1]}),
     "BYTES data must be strings"),
    (request_body({"name": "x", "datatype": "FP32", "shape": [1]}),
     "neither 'data' nor a binary_data_size"),
    (request_body(FP32_X, FP32_X), "input 'x' is given more than once"),
    (request_body(FP32_X, outputs={"name": "y"}), "'outputs' must be a list"),
    (request_body(FP32_X, outputs=["y"]), "requested output must be an object with a 'name'"),
    (request_body(FP32_X, outputs=[{"name": "y", "parameters": [1]}]),
     "output 'y' 'parameters' must be a JSON object"),
    (request_body(FP32_X, parameters=[1]), "request 'parameters' must be a JSON object"),
    (request_body(FP32_X, id=7), "'id' must be a string"),
])
def test_malformed_json_request_is_invalid_input(body: bytes, fragment: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        decode_request(body)
    assert fragment in caught.value.message


def binary_input(datatype: str, shape: list[int], size: Any, name: str = "x") -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape,
            "parameters": {"binary_data_size": size}}


@pytest.mark.parametrize(("doc", "chunks", "fragment"), [
    ({"inputs": [binary_input("FP32", [2], 8)]}, [b"\0" * 4],
     "binary_data_size is 8 but only 4 bytes of binary data remain"),
    ({"inputs": [binary_input("FP32", [1], 4, "a"), binary_input("FP32", [1], 4, "b")]},
     [b"\0" * 6], "input 'b': binary_data_size is 4 but only 2 bytes"),
    ({"inputs": [binary_input("FP32", [2], 4)]}, [b"\0" * 4],
     "needs 8 bytes, binary_data_size is 4"),
    ({"inputs": [binary_input("INT64", [1], 4)]}, [b"\0" * 4], "needs 8 bytes"),
    ({"inputs": [binary_input("FP32", [1], 4)]}, [b"\0" * 7], "3 bytes after the declared tensors"),
    ({"inputs": [FP32_X]}, [b"junk"], "4 bytes after the declared tensors"),
    ({"inputs": [binary_input("FP32", [1], -4)]}, [b""], "non-negative integer"),
    ({"inputs": [binary_input("FP32", [1], "4")]}, [b"\0" * 4], "non-negative integer"),
    ({"inputs": [binary_input("BYTES", [1], 7)]}, [struct.pack("<I", 10) + b"abc"],
     "BYTES element of 10 bytes overruns its data"),
    ({"inputs": [binary_input("BYTES", [2], 9)]}, [length_prefixed(b"abc") + b"\x01\0"],
     "ends inside an element length"),
    ({"inputs": [binary_input("BYTES", [2], 7)]}, [length_prefixed(b"abc")],
     "needs 2 BYTES elements, got 1"),
    ({"inputs": [binary_input("FP32", [1], 4), binary_input("FP32", [1], 4)]},
     [b"\0" * 8], "given more than once"),
])
def test_malformed_binary_request_is_invalid_input(
    doc: dict[str, Any], chunks: list[bytes], fragment: str
) -> None:
    body, header_length = with_binary(doc, *chunks)
    with pytest.raises(InvalidInput) as caught:
        decode_request(body, header_length)
    assert fragment in caught.value.message


def test_binary_data_without_header_length_has_no_bytes_to_read() -> None:
    body = request_body(binary_input("FP32", [1], 4))
    with pytest.raises(InvalidInput, match="only 0 bytes of binary data remain"):
        decode_request(body)


@pytest.mark.parametrize("header_length", [-1, 10_000])
def test_header_length_outside_the_body_is_invalid_input(header_length: int) -> None:
    body = request_body(FP32_X)
    with pytest.raises(InvalidInput) as caught:
        decode_request(body, header_length)
    assert f"Inference-Header-Content-Length is {header_length}" in caught.value.message
    assert f"{len(body)} bytes" in caught.value.message


def test_header_length_that_cuts_the_json_is_invalid_input() -> None:
    body = request_body(FP32_X)
    with pytest.raises(InvalidInput, match="not valid JSON"):
        decode_request(body, len(body) - 1)


def test_string_after_the_first_element_of_fp32_data_is_invalid_input() -> None:
    body = request_body({"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, "2.0"]})
    with pytest.raises(InvalidInput, match="FP32"):
        decode_request(body)


def test_fractional_number_for_int32_is_invalid_input() -> None:
    body = request_body({"name": "x", "datatype": "INT32", "shape": [1], "data": [1.5]})
    with pytest.raises(InvalidInput, match="INT32"):
        decode_request(body)


SHM = {"shared_memory_region": "r", "shared_memory_byte_size": 24, "shared_memory_offset": 8}


def test_shared_memory_inputs_and_outputs_are_decoded_as_windows() -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3], "parameters": SHM},
                       {"name": "y", "datatype": "INT32", "shape": [1], "data": [4]}],
            "outputs": [{"name": "o", "parameters": {**SHM, "binary_data": True}}]}
    request = decode_request(json.dumps(body).encode())
    assert list(request.inputs) == ["y"]
    item = request.shared_memory_inputs["x"]
    assert (item.datatype, item.shape, item.ref.region, item.ref.byte_size,
            item.ref.offset) == ("FP32", (2, 3), "r", 24, 8)
    assert request.outputs is not None and request.outputs[0].shared_memory == item.ref


def test_shared_memory_beside_data_is_refused() -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0],
                        "parameters": SHM}]}
    with pytest.raises(InvalidInput, match="must carry neither 'data' nor binary_data_size"):
        decode_request(json.dumps(body).encode())


def test_outputs_written_to_shared_memory_carry_parameters_not_data() -> None:
    response = InferResponse("m", "1", {"o": np.ones(3, np.float32), "p": np.ones(1, np.int32)},
                             shared_memory_outputs={"o": {"shared_memory_region": "r",
                                                          "shared_memory_byte_size": 12}})
    request = InferRequest(inputs={}, outputs=[RequestedOutput("o", binary=True),
                                               RequestedOutput("p")])
    body, json_length = encode_response(response, request)
    assert json_length is None
    outputs = json.loads(body)["outputs"]
    assert outputs[0] == {"name": "o", "datatype": "FP32", "shape": [3], "parameters": {
        "shared_memory_region": "r", "shared_memory_byte_size": 12}}
    assert outputs[1]["data"] == [1]
