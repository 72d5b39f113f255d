"""Triton's generate extension (`POST /v2/models/M/generate`, `generate_stream`): a flat JSON
object in, a flat JSON object out, for text-in text-out models.

A field named as one of the model's inputs becomes that input: a JSON value (a string, number
or boolean, or a list of them) shaped to the input's declared shape, with a batch of one where
the model batches. Every other field, and those under "parameters", become request parameters.
Each output comes back as a field: one element as a JSON scalar, more as a (nested) list; BYTES
as UTF-8 text (invalid bytes replaced).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from serval.errors import InvalidInput, shown
from serval.protocol.rest_codec import json_inputs
from serval.protocol.types import InferRequest, InferResponse, TensorSpec

_SCALARS = (str, int, float, bool)
_SCALAR_TYPES = frozenset(_SCALARS)  # as orjson reads JSON: these exact types


def generate_request(doc: dict[str, Any], inputs: tuple[TensorSpec, ...],
                     batching: bool) -> InferRequest:
    """The infer request a generate body stands for; InvalidInput names what is wrong."""
    parameters = doc.get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidInput("generate request 'parameters' must be a JSON object")
    parameters = dict(parameters)
    names = {spec.name for spec in inputs}
    for key, value in doc.items():
        if key != "parameters" and key not in names:
            parameters[key] = value
    for key, value in parameters.items():
        if not isinstance(value, _SCALARS):
            raise InvalidInput(f"generate request parameter '{key[:64]}' must be a string, "
                               f"number or boolean, got {shown(value)}")
    raw = []
    for spec in inputs:
        if spec.name not in doc:
            wanted = ", ".join(f"'{s.name}' ({s.datatype})" for s in inputs)
            raise InvalidInput(f"generate request has no field '{spec.name}'; the model's "
                               f"inputs are {wanted}")
        raw.append(_tensor(spec, doc[spec.name], batching))
    return InferRequest(inputs=json_inputs(raw), parameters=parameters,
                        id=parameters["id"] if isinstance(parameters.get("id"), str) else None)


def generate_response(response: InferResponse, batching: bool) -> dict[str, Any]:
    """The generate answer: model_name, model_version and one field per output."""
    doc: dict[str, Any] = {"model_name": response.model_name,
                           "model_version": response.model_version}
    for name, array in response.outputs.items():
        if batching and array.ndim and array.shape[0] == 1:
            array = array[0]  # the batch of one the request was sent as
        doc[name] = _json_value(array)
    return doc


def _tensor(spec: TensorSpec, value: Any, batching: bool) -> dict[str, Any]:
    try:
        array = np.array(value, dtype=object)  # a ragged list: a 1-D array of lists
    except ValueError:
        array = np.array([[]], dtype=object)
    natural = array.shape
    flat = array.reshape(-1).tolist()  # (array.flat stops at 32 dimensions)
    if 0 in natural or set(map(type, flat)) - _SCALAR_TYPES:
        raise InvalidInput(f"generate field '{spec.name}' must be a string, number or boolean, "
                           f"or a rectangular list of them, got {shown(value)}")
    declared = list(spec.shape[1:] if batching else spec.shape)
    count = math.prod(natural)
    if len(natural) == len(declared):
        shape = list(natural)
    else:  # fit the elements to the declared shape: free dimensions take what is left
        shape = [1 if size == -1 else size for size in declared]
        free = [index for index, size in enumerate(declared) if size == -1]
        if free:
            fixed = math.prod(size for size in declared if size != -1)
            shape[free[-1]] = count // fixed if fixed and count % fixed == 0 else count
    return {"name": spec.name, "datatype": spec.datatype,
            "shape": [1, *shape] if batching else shape, "data": flat}


def _json_value(array: np.ndarray) -> Any:
    if array.dtype == object or array.dtype.kind == "S":
        text = np.vectorize(_text, otypes=[object])(array) if array.size else array
        return text.item() if array.size == 1 else np.asarray(text).tolist()
    return array.reshape(-1)[0].item() if array.size == 1 else array.tolist()


def _text(item: Any) -> Any:
    return item.decode("utf-8", "replace") if isinstance(item, bytes) else item
