"""KServe v2 REST bodies: JSON tensors and Triton's binary tensor data extension."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from serval.errors import InvalidInput
from serval.protocol.bytes_tensor import as_text, tensor_from_raw, tensor_to_raw
from serval.protocol.classification import class_count
from serval.protocol.dtypes import numpy_dtype, v2_datatype
from serval.protocol.shapes import check_shape
from serval.protocol.shm_tensors import shared_memory_ref
from serval.protocol.types import (
    InferRequest,
    InferResponse,
    RequestedOutput,
    SharedMemoryInput,
    TensorDict,
)

_DUMPS_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def decode_request(body: bytes, header_length: int | None = None) -> InferRequest:
    """Decode an infer body; header_length is Inference-Header-Content-Length, if sent."""
    if header_length is None:
        json_end = len(body)
    elif 0 <= header_length <= len(body):
        json_end = header_length
    else:
        raise InvalidInput(
            f"Inference-Header-Content-Length is {header_length} but the body has "
            f"{len(body)} bytes"
        )
    doc = json_object(memoryview(body)[:json_end], "request body",
                      "a JSON object with an 'inputs' list")
    binary = _BinarySection(body, json_end)
    shm_inputs: dict[str, SharedMemoryInput] = {}
    inputs = _decode_inputs(doc.get("inputs"), binary, shm_inputs)
    binary.check_consumed()
    parameters = _object_field(doc, "parameters", "request")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("request 'id' must be a string")
    return InferRequest(
        inputs=inputs,
        outputs=_decode_requested_outputs(doc.get("outputs")),
        id=request_id,
        parameters=parameters,
        binary_output=bool(parameters.get("binary_data_output", False)),
        shared_memory_inputs=shm_inputs,
    )


def json_inputs(raw_inputs: list[dict[str, Any]]) -> TensorDict:
    """Inputs given as v2 JSON tensors (name, datatype, shape, data; no binary data, no shared
    memory), checked as an infer body's are: what the generate extension's fields become."""
    return _decode_inputs(raw_inputs, _BinarySection(b"", 0), {})


def encode_response(response: InferResponse, request: InferRequest) -> tuple[bytes, int | None]:
    """Encode outputs as JSON, binary where asked; returns (body, json header length or None)."""
    binary_by_name = _binary_choices(request)
    entries: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for name, array in response.outputs.items():
        binary = binary_by_name.get(name, request.binary_output)
        entry: dict[str, Any] = {
            "name": name,
            "datatype": v2_datatype(array.dtype),
            "shape": list(array.shape),
        }
        if name in response.shared_memory_outputs:  # written to its region: no data
            entry["parameters"] = response.shared_memory_outputs[name]
        elif binary:
            raw = tensor_to_raw(array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_data(array)
        entries.append(entry)
    doc: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": entries,
    }
    if response.id is not None:
        doc["id"] = response.id
    header = orjson.dumps(doc, option=_DUMPS_OPTIONS)
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


class _BinarySection:
    """The bytes after the JSON header, handed out in input order."""

    __slots__ = ("body", "end", "offset")

    def __init__(self, body: bytes, start: int) -> None:
        self.body, self.offset, self.end = body, start, len(body)

    def take(self, size: int, input_name: str) -> tuple[int, int]:
        if self.offset + size > self.end:
            raise InvalidInput(
                f"input '{input_name}': binary_data_size is {size} but only "
                f"{self.end - self.offset} bytes of binary data remain"
            )
        start = self.offset
        self.offset += size
        return start, size

    def check_consumed(self) -> None:
        if self.offset != self.end:
            raise InvalidInput(
                f"request body has {self.end - self.offset} bytes after the declared tensors"
            )


def json_object(raw: bytes | memoryview | str, what: str, shape: str) -> dict[str, Any]:
    """Parse JSON that must be an object; InvalidInput says what was wrong with `what`."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"{what} must be {shape}")
    return doc


def _object_field(doc: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = doc.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"{where} '{key}' must be a JSON object")
    return value


def _decode_inputs(raw_inputs: Any, binary: _BinarySection,
                   shm_inputs: dict[str, SharedMemoryInput]) -> TensorDict:
    """The inputs carried in the body; those in shared memory go to shm_inputs."""
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("request must have a non-empty 'inputs' list")
    inputs: TensorDict = {}
    for raw in raw_inputs:
        name, array = _decode_input(raw, binary)
        if name in inputs or name in shm_inputs:
            raise InvalidInput(f"input '{name}' is given more than once")
        if isinstance(array, SharedMemoryInput):
            shm_inputs[name] = array
        else:
            inputs[name] = array
    return inputs


def _decode_input(raw: Any, binary: _BinarySection) -> tuple[str, np.ndarray | SharedMemoryInput]:
    if not isinstance(raw, dict):
        raise InvalidInput("each input must be a JSON object with name, datatype, shape, data")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput("an input has no 'name' string")
    datatype = raw.get("datatype")
    if not isinstance(datatype, str):
        raise InvalidInput(f"input '{name}': 'datatype' must be a string such as \"FP32\"")
    dtype = numpy_dtype(datatype)
    shape = _decode_shape(raw.get("shape"), name)
    count = math.prod(shape)
    params = _object_field(raw, "parameters", f"input '{name}'")
    size = params.get("binary_data_size")
    shm = shared_memory_ref(params, f"input '{name}'")
    if shm is not None:
        if size is not None or "data" in raw:
            raise InvalidInput(f"input '{name}' takes its data from shared memory region "
                               f"'{shm.region}'; it must carry neither 'data' nor "
                               "binary_data_size")
        return name, SharedMemoryInput(datatype, shape, shm)
    if size is not None:
        array = _binary_input(binary, name, datatype, shape, size)
    elif "data" in raw:
        array = _json_input(raw["data"], name, datatype, dtype, shape, count)
    else:
        raise InvalidInput(f"input '{name}' has neither 'data' nor a binary_data_size parameter")
    return name, array


def _decode_shape(raw: Any, name: str) -> tuple[int, ...]:
    if not isinstance(raw, list):
        raise InvalidInput(
            f"input '{name}': 'shape' must be a list of non-negative integers, "
            f"got {_short_repr(raw)}"
        )
    return check_shape(raw, name)


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _binary_input(
    binary: _BinarySection, name: str, datatype: str, shape: tuple[int, ...], size: Any
) -> np.ndarray:
    if type(size) is not int or size < 0:
        raise InvalidInput(f"input '{name}': binary_data_size must be a non-negative integer")
    start, size = binary.take(size, name)
    return tensor_from_raw(binary.body, start, size, datatype, shape, name)


def _json_input(
    data: Any, name: str, datatype: str, dtype: np.dtype, shape: tuple[int, ...], count: int
) -> np.ndarray:
    if not isinstance(data, list):
        raise InvalidInput(f"input '{name}': 'data' must be a JSON list")
    if datatype == "BYTES":
        array = _bytes_from_json(data, name)
    else:
        array = _numbers_from_json(data, name, datatype, dtype)
    if array.size != count:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} needs {count} elements, "
            f"'data' has {array.size}"
        )
    return array.reshape(shape)


# JSON value kinds (as numpy infers them) each target kind accepts.
_ACCEPTED_KINDS = {"f": "iuf", "i": "iu", "u": "iu", "b": "b"}
_EXPECTED_WORDS = {"f": "numbers", "i": "numbers (integers)", "u": "numbers (integers)",
                   "b": "true/false values"}


def _numbers_from_json(data: list[Any], name: str, datatype: str, dtype: np.dtype) -> np.ndarray:
    try:
        parsed = np.asarray(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"input '{name}': data is not valid {datatype}: {exc}") from None
    if datatype == "UINT64" and parsed.dtype.kind in "fO":
        return _uint64_from_json(data, name)  # numpy reads ints above 2**63 as float64
    if parsed.size and parsed.dtype.kind not in _ACCEPTED_KINDS[dtype.kind]:
        raise InvalidInput(
            f"input '{name}': {datatype} data must be {_EXPECTED_WORDS[dtype.kind]}, "
            f"got {_short_repr(_first_scalar(data))}" + _first_offender(parsed, dtype.kind)
        )
    if dtype.kind in "iu" and parsed.size:
        limits = np.iinfo(dtype)
        if parsed.min() < limits.min or parsed.max() > limits.max:
            raise InvalidInput(
                f"input '{name}': data is not valid {datatype}: values must lie in "
                f"[{limits.min}, {limits.max}]"
            )
    return parsed.astype(dtype, copy=False)


def _uint64_from_json(data: list[Any], name: str) -> np.ndarray:
    for value in _flatten(data):
        if type(value) is not int or not 0 <= value < 2**64:
            raise InvalidInput(
                f"input '{name}': UINT64 data must be integers in [0, 2**64), "
                f"got {_short_repr(value)}"
            )
    return np.array(data, dtype=np.uint64)


def _first_offender(parsed: np.ndarray, target_kind: str) -> str:
    accepted = _ACCEPTED_KINDS[target_kind]
    for value in parsed.ravel().tolist():
        if np.asarray(value).dtype.kind not in accepted:
            return f" (first bad value {_short_repr(value)})"
    return ""


def _bytes_from_json(data: list[Any], name: str) -> np.ndarray:
    flat = _flatten(data)
    array = np.empty(len(flat), dtype=object)
    for index, element in enumerate(flat):
        if isinstance(element, str):
            array[index] = element.encode("utf-8")
        else:
            raise InvalidInput(
                f"input '{name}': BYTES data must be strings, got {_short_repr(element)}")
    return array


def _first_scalar(data: list[Any]) -> Any:
    value: Any = data
    while isinstance(value, list) and value:
        value = value[0]
    return value


def _flatten(data: list[Any]) -> list[Any]:
    if not any(isinstance(item, list) for item in data):
        return data
    flat: list[Any] = []
    for item in data:
        flat.extend(_flatten(item) if isinstance(item, list) else [item])
    return flat


def _decode_requested_outputs(raw: Any) -> list[RequestedOutput] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise InvalidInput("'outputs' must be a list of {\"name\": ...} objects")
    requested: list[RequestedOutput] = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInput("each requested output must be an object with a 'name' string")
        params = _object_field(item, "parameters", f"output '{item['name']}'")
        binary = params.get("binary_data")
        requested.append(RequestedOutput(
            item["name"], None if binary is None else bool(binary),
            class_count(params.get("classification", 0), item["name"]),
            shared_memory_ref(params, f"output '{item['name']}'")))
    return requested


def _binary_choices(request: InferRequest) -> dict[str, bool]:
    if not request.outputs:
        return {}
    return {o.name: o.binary for o in request.outputs if o.binary is not None}


def _json_data(array: np.ndarray) -> Any:
    if array.dtype == object or array.dtype.kind in ("U", "S"):
        return [as_text(element) for element in array.ravel()]
    return np.ascontiguousarray(array).ravel()
