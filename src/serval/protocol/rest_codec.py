"""KServe v2 REST bodies: JSON tensors and Triton's binary tensor data extension."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import orjson

from serval.errors import InvalidInput, shown
from serval.protocol.bytes_tensor import as_text, tensor_from_raw, tensor_to_raw
from serval.protocol.classification import class_count
from serval.protocol.dtypes import numpy_dtype, v2_datatype
from serval.protocol.shapes import MAX_DIMS, check_shape
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
    binary = _BinarySection(body, json_end, body.find(b"true", 0, json_end) >= 0
                            or body.find(b"false", 0, json_end) >= 0)
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
        binary_output=_flag(parameters, "binary_data_output", "request parameter") or False,
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


def json_elements(response: InferResponse, request: InferRequest) -> int:
    """How many elements encode_response would write as JSON (what its cost grows with)."""
    binary_by_name = _binary_choices(request)
    return sum(array.size for name, array in response.outputs.items()
               if name not in response.shared_memory_outputs
               and not binary_by_name.get(name, request.binary_output))


class _BinarySection:
    """The bytes after the JSON header, handed out in input order; and whether the header
    holds a JSON true or false anywhere (only then may a number numpy read be a boolean in
    disguise: one C-speed scan of the header spares every request the element-wise check)."""

    __slots__ = ("body", "booleans", "end", "offset")

    def __init__(self, body: bytes, start: int, booleans: bool = True) -> None:
        self.body, self.offset, self.end = body, start, len(body)
        self.booleans = booleans

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


def _flag(params: dict[str, Any], key: str, where: str, output: str = "") -> bool | None:
    """A boolean parameter: a JSON true or false (as Triton), None when absent; any other
    value (the string "false", 0, []) is refused, never read as its truth value. `where`
    ("{}" standing for `output`, cut short) is formatted only for the refusal."""
    value = params.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise InvalidInput(f"{where.format(output[:64])} '{key}' must be a JSON boolean (true or "
                       f"false), got {shown(value)}")


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
        array = _json_input(raw["data"], name, datatype, dtype, shape, count, binary.booleans)
    else:
        raise InvalidInput(f"input '{name}' has neither 'data' nor a binary_data_size parameter")
    return name, array


def _decode_shape(raw: Any, name: str) -> tuple[int, ...]:
    if not isinstance(raw, list):
        raise InvalidInput(
            f"input '{name}': 'shape' must be a list of non-negative integers, "
            f"got {shown(raw, 200)}"
        )
    return check_shape(raw, name)


def _binary_input(
    binary: _BinarySection, name: str, datatype: str, shape: tuple[int, ...], size: Any
) -> np.ndarray:
    if type(size) is not int or size < 0:
        raise InvalidInput(f"input '{name}': binary_data_size must be a non-negative integer")
    start, size = binary.take(size, name)
    return tensor_from_raw(binary.body, start, size, datatype, shape, name)


def _json_input(
    data: Any, name: str, datatype: str, dtype: np.dtype, shape: tuple[int, ...], count: int,
    booleans: bool,
) -> np.ndarray:
    if not isinstance(data, list):
        raise InvalidInput(f"input '{name}': 'data' must be a JSON list")
    if datatype == "BYTES":
        array = _bytes_from_json(data, name, shape, count)
    else:
        array = _numbers_from_json(data, name, datatype, dtype, booleans)
    if array.size != count:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} needs {count} elements, "
            f"'data' has {array.size}"
        )
    return array.reshape(shape)


# JSON value kinds (as numpy infers them) each target kind accepts, and the Python types (as
# orjson reads JSON values) that stand for them: a JSON boolean is no number, though numpy would
# read [true, 0.5] as [1.0, 0.5].
_ACCEPTED_KINDS = {"f": "iuf", "i": "iu", "u": "iu", "b": "b"}
_ACCEPTED_TYPES = {"f": frozenset((int, float)), "i": frozenset((int,)),
                   "u": frozenset((int,)), "b": frozenset((bool,))}
_EXPECTED_WORDS = {"f": "numbers", "i": "numbers (integers)", "u": "numbers (integers)",
                   "b": "true/false values"}


def _numbers_from_json(data: list[Any], name: str, datatype: str, dtype: np.dtype,
                       booleans: bool) -> np.ndarray:
    try:
        parsed = np.asarray(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInput(f"input '{name}': data is not valid {datatype}: {exc}") from None
    if datatype == "UINT64" and parsed.dtype.kind in "fO":
        return _uint64_from_json(data, parsed.shape, name)  # ints above 2**63: float64
    kind = dtype.kind
    if parsed.size and (parsed.dtype.kind not in _ACCEPTED_KINDS[kind]
                        or (kind != "b" and booleans and _may_hide_booleans(parsed))):
        offender = _first_offender(data, parsed, _ACCEPTED_TYPES[kind])
        if offender is not None:
            index, value = offender
            raise InvalidInput(f"input '{name}': {datatype} data must be "
                               f"{_EXPECTED_WORDS[kind]}, got {shown(value, 200)} "
                               f"(element {index})")
        if parsed.dtype.kind not in _ACCEPTED_KINDS[kind]:  # not expected: numpy's own kinds
            raise InvalidInput(f"input '{name}': {datatype} data must be "
                               f"{_EXPECTED_WORDS[kind]}")
    if kind in "iu" and parsed.size:
        limits = np.iinfo(dtype)
        if parsed.min() < limits.min or parsed.max() > limits.max:
            raise InvalidInput(
                f"input '{name}': data is not valid {datatype}: values must lie in "
                f"[{limits.min}, {limits.max}]"
            )
    return parsed.astype(dtype, copy=False)


def _may_hide_booleans(parsed: np.ndarray) -> bool:
    """Whether numbers numpy read could include JSON booleans: they become exactly 0 or 1."""
    return parsed.dtype.kind in "iuf" and bool(np.any((parsed == 0) | (parsed == 1)))


def _first_offender(data: list[Any], parsed: np.ndarray,
                    accepted: frozenset[type]) -> tuple[int, Any] | None:
    """The first element (row-major index, value) whose JSON type is not accepted; None if
    none. No Python code runs per element (a null after 8M numbers was seconds of it)."""
    if data and not isinstance(data[0], list):
        flat = data
    else:  # numpy read it as a rectangular array: as objects it holds the JSON values
        objects = parsed if parsed.dtype == object else np.asarray(data, dtype=object)
        flat = objects.ravel().tolist()
    return _first_not_of(flat, accepted)


def _first_not_of(flat: list[Any], accepted: frozenset[type]) -> tuple[int, Any] | None:
    """The first of flat (index, value) whose type is not accepted, or None: two C-speed
    passes, the second only when there is one."""
    wrong = set(map(type, flat)) - accepted
    if not wrong:
        return None
    types = list(map(type, flat))
    index = min(map(types.index, wrong))
    return index, flat[index]


def _uint64_from_json(data: list[Any], shape: tuple[int, ...], name: str) -> np.ndarray:
    flat = _flatten(data, name)
    offender = _first_not_of(flat, frozenset((int,)))
    if offender is None:
        try:
            return np.array(flat, dtype=np.uint64).reshape(shape)
        except OverflowError:  # a negative or one of 2**64 or more: find which
            objects = np.array(flat, dtype=object)
            index = int(np.flatnonzero((objects < 0) | (objects >= 2**64))[0])
            offender = index, flat[index]
    index, value = offender
    raise InvalidInput(f"input '{name}': UINT64 data must be integers in [0, 2**64), "
                       f"got {shown(value, 200)} (element {index})")


def _bytes_from_json(data: list[Any], name: str, shape: tuple[int, ...],
                     count: int) -> np.ndarray:
    flat = _flatten(data, name, count)
    if len(flat) != count:
        has = f"more than {count}" if len(flat) > count else str(len(flat))
        raise InvalidInput(f"input '{name}': shape {list(shape)} needs {count} elements, "
                           f"'data' has {has}")
    offender = _first_not_of(flat, frozenset((str,)))
    if offender is not None:
        index, value = offender
        raise InvalidInput(f"input '{name}': BYTES data must be strings, got "
                           f"{shown(value, 200)} (element {index})")
    array = np.empty(len(flat), dtype=object)
    array[:] = list(map(str.encode, flat))
    return array


def _flatten(data: list[Any], name: str, limit: int | None = None) -> list[Any]:
    """The scalars of nested lists in order, nested at most MAX_DIMS deep (no recursion: JSON
    may nest 1024 deep); with a limit, stops once it has more than `limit`."""
    if list not in set(map(type, data)):
        return data
    flat: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is not list:
                flat.append(item)
            elif len(stack) >= MAX_DIMS:
                raise InvalidInput(f"input '{name}': 'data' nests lists more than "
                                   f"{MAX_DIMS} deep; a tensor has at most {MAX_DIMS} "
                                   "dimensions")
            elif list not in set(map(type, item)):  # innermost: all at once
                flat.extend(item)
            else:
                stack.append(iter(item))
                break
            if limit is not None and len(flat) > limit:
                return flat
        else:
            stack.pop()
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
        binary = _flag(params, "binary_data", "output '{}' parameter", item["name"])
        requested.append(RequestedOutput(
            item["name"], binary,
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
