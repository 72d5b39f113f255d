"""ModelInferRequest/Response <-> Serval's InferRequest/InferResponse (typed and raw contents)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from serval.errors import InvalidInput
from serval.protocol.bytes_tensor import tensor_from_raw, tensor_to_raw
from serval.protocol.classification import class_count
from serval.protocol.dtypes import lookup, v2_datatype
from serval.protocol.grpc import grpc_service_pb2 as pb
from serval.protocol.shapes import check_shape
from serval.protocol.types import InferRequest, InferResponse, RequestedOutput, TensorDict


def decode_infer_request(message: pb.ModelInferRequest) -> InferRequest:
    """Inputs from raw_input_contents (one entry per input) or from typed contents."""
    raw = message.raw_input_contents
    if raw:  # Triton's rule and words: raw for every input, and then no typed contents
        for tensor in message.inputs:
            if tensor.HasField("contents"):
                raise InvalidInput(f"contents field must not be specified when using "
                                   f"raw_input_contents for '{tensor.name}' for model "
                                   f"'{message.model_name}'")
    if raw and len(raw) != len(message.inputs):
        raise InvalidInput(
            f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs; "
            "send every input raw, or none"
        )
    if not message.inputs:
        raise InvalidInput("request must have at least one input")
    inputs: TensorDict = {}
    for index, tensor in enumerate(message.inputs):
        if tensor.name in inputs:
            raise InvalidInput(f"input '{tensor.name}' is given more than once")
        inputs[tensor.name] = _decode_input(tensor, raw[index] if raw else None)
    return InferRequest(
        inputs=inputs,
        outputs=[_requested_output(output) for output in message.outputs] or None,
        id=message.id or None,
        parameters={key: _parameter(value) for key, value in message.parameters.items()},
        binary_output=True,
    )


def encode_infer_response(response: InferResponse) -> pb.ModelInferResponse:
    """Every output as raw_output_contents, as Triton answers."""
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version,
        id=response.id or "",
    )
    for name, array in response.outputs.items():
        message.outputs.add(name=name, datatype=v2_datatype(array.dtype), shape=array.shape)
        message.raw_output_contents.append(tensor_to_raw(array))
    return message


def _requested_output(output: Any) -> RequestedOutput:
    """A requested output; its `classification` parameter (tritonclient's class_count, an
    int64_param) asks for the top classes instead of the tensor."""
    count = 0
    if "classification" in output.parameters:
        count = class_count(_parameter(output.parameters["classification"]), output.name)
    return RequestedOutput(output.name, class_count=count)


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
    return _typed_array(values, row.numpy, datatype, name).reshape(shape)


def _typed_array(values: Any, dtype: np.dtype, datatype: str, name: str) -> np.ndarray:
    if datatype == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
        return array
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
