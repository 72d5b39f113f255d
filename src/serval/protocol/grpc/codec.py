"""ModelInferRequest/Response <-> Serval's InferRequest/InferResponse (typed and raw contents)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np

from serval.errors import InvalidInput
from serval.protocol.bytes_tensor import object_array, tensor_from_raw, tensor_to_raw
from serval.protocol.classification import class_count
from serval.protocol.dtypes import lookup, v2_datatype
from serval.protocol.grpc import grpc_service_pb2 as pb
from serval.protocol.grpc.packed import packed_contents
from serval.protocol.shapes import check_shape
from serval.protocol.shm_tensors import PARAMETERS, shared_memory_ref
from serval.protocol.types import (
    InferRequest,
    InferResponse,
    RequestedOutput,
    SharedMemoryInput,
    TensorDict,
)

INLINE_BYTES_ELEMENTS = 1 << 14  # ~15 ms of the event loop to decode


def has_many_bytes_elements(message: pb.ModelInferRequest) -> bool:
    """Whether decoding would build a large BYTES tensor (~1 us an element in Python): the
    transport then decodes on a thread. Judged from sizes alone, without decoding."""
    if not any(tensor.datatype == "BYTES" for tensor in message.inputs):
        return False
    raw_bytes = sum(len(entry) for entry in message.raw_input_contents)
    return raw_bytes > 4 * INLINE_BYTES_ELEMENTS or any(
        len(tensor.contents.bytes_contents) > INLINE_BYTES_ELEMENTS for tensor in message.inputs)


async def decoded(message: pb.ModelInferRequest) -> InferRequest:
    """decode_infer_request, on a thread where it would build a large BYTES tensor."""
    if has_many_bytes_elements(message):
        return await asyncio.to_thread(decode_infer_request, message)
    return decode_infer_request(message)


def decode_infer_request(message: pb.ModelInferRequest) -> InferRequest:
    """Inputs from raw_input_contents (one entry per input not in shared memory) or from typed
    contents; inputs in shared memory are resolved later (DataPlane)."""
    raw = message.raw_input_contents
    tensors = message.inputs
    if not tensors:
        raise InvalidInput("request must have at least one input")
    carried: dict[str, Any] = {}  # name -> its tensor message, data in the request
    shm: dict[str, SharedMemoryInput] = {}
    for tensor in tensors:  # one pass: each element read from the message once
        name = tensor.name
        if raw and tensor.HasField("contents"):  # Triton's rule and words
            raise InvalidInput(f"contents field must not be specified when using "
                               f"raw_input_contents for '{name}' for model "
                               f"'{message.model_name}'")
        if name in carried or name in shm:
            raise InvalidInput(f"input '{name}' is given more than once")
        parameters = tensor.parameters
        if parameters and any(key in parameters for key in PARAMETERS):
            shm[name] = _shared_memory_input(tensor, parameters)
        else:
            carried[name] = tensor  # decoded below, once the raw entries are known to fit
    if raw and len(raw) != len(carried):
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries for {len(carried)} inputs not in "
            "shared memory; send every such input raw, or none")
    inputs: TensorDict = {name: _decode_input(tensor, raw[index] if raw else None)
                          for index, (name, tensor) in enumerate(carried.items())}
    return InferRequest(
        inputs=inputs,
        outputs=[_requested_output(output) for output in message.outputs] or None,
        id=message.id or None,
        parameters={key: _parameter(value) for key, value in message.parameters.items()},
        binary_output=True,
        shared_memory_inputs=shm,
    )


def _shared_memory_input(tensor: Any, parameters: Any) -> SharedMemoryInput:
    """An input whose bytes are in shared memory (no contents, no raw entry of its own)."""
    what = f"input '{tensor.name}'"
    ref = shared_memory_ref({key: _parameter(value) for key, value in parameters.items()},
                            what)
    assert ref is not None
    if tensor.HasField("contents"):
        raise InvalidInput(f"{what} takes its data from shared memory region "
                           f"'{ref.region}'; it must not carry contents as well")
    lookup(tensor.datatype)  # a datatype Serval knows
    return SharedMemoryInput(tensor.datatype, check_shape(list(tensor.shape), tensor.name), ref)


def encode_infer_response(response: InferResponse) -> pb.ModelInferResponse:
    """Every output as raw_output_contents, as Triton answers."""
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version,
        id=response.id or "",
    )
    for name, array in response.outputs.items():
        tensor = message.outputs.add(name=name, datatype=v2_datatype(array.dtype),
                                     shape=array.shape)
        shm = response.shared_memory_outputs.get(name)
        if shm is None:
            message.raw_output_contents.append(tensor_to_raw(array))
            continue
        for key, value in shm.items():  # written to its region: parameters, no data
            _set_parameter(tensor.parameters[key], value)
        message.raw_output_contents.append(b"")  # keeps raw entries in step with outputs
    return message


def _requested_output(output: Any) -> RequestedOutput:
    """A requested output; its `classification` parameter (tritonclient's class_count, an
    int64_param) asks for the top classes instead of the tensor."""
    count = 0
    if "classification" in output.parameters:
        count = class_count(_parameter(output.parameters["classification"]), output.name)
    if not output.parameters:
        return RequestedOutput(output.name, class_count=count)
    params = {key: _parameter(value) for key, value in output.parameters.items()}
    return RequestedOutput(output.name, class_count=count, shared_memory=shared_memory_ref(
        params, f"output '{output.name}'"))


def _decode_input(tensor: Any, raw: bytes | None) -> np.ndarray:
    name, datatype = tensor.name, tensor.datatype
    row = lookup(datatype)
    shape = check_shape(list(tensor.shape), name)
    if raw is not None:
        return tensor_from_raw(raw, 0, len(raw), datatype, shape, name, "raw_input_contents has")
    field = row.grpc_contents  # FP16 travels raw only
    if field is None:
        raise InvalidInput(f"input '{name}': {datatype} has no typed contents field; "
                           "send it in raw_input_contents")
    values = getattr(tensor.contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidInput(f"input '{name}': shape {list(shape)} needs {count} elements, "
                           f"contents.{field} has {len(values)}")
    packed = packed_contents(tensor.contents, field, count)  # None: read element-wise
    return _typed_array(values if packed is None else packed, row.numpy, datatype,
                        name).reshape(shape)


def _typed_array(values: Any, dtype: np.dtype, datatype: str, name: str) -> np.ndarray:
    if datatype == "BYTES":
        return object_array(values)  # a chunk of the container at a time
    wide = np.asarray(values)
    if dtype.kind in "iu" and wide.size:
        limits = np.iinfo(dtype)
        if wide.min() < limits.min or wide.max() > limits.max:
            raise InvalidInput(f"input '{name}': contents are not valid {datatype}: values must "
                               f"lie in [{limits.min}, {limits.max}]")
    return wide.astype(dtype, copy=False)


def _parameter(value: Any) -> Any:
    choice = value.WhichOneof("parameter_choice")
    return getattr(value, choice) if choice else None


def _set_parameter(parameter: Any, value: Any) -> None:
    if isinstance(value, str):
        parameter.string_param = value
    else:
        parameter.int64_param = value
