"""The generate extension's codec: fields to tensors shaped as the model declares, the rest to
parameters, outputs back to JSON values."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from serval.errors import InvalidInput
from serval.protocol.generate import generate_request, generate_response
from serval.protocol.types import InferResponse, TensorSpec

pytestmark = pytest.mark.unit

TEXT = TensorSpec("text_input", "BYTES", (-1, 1))
TOKENS = TensorSpec("max_tokens", "INT32", (-1, 1))


@pytest.mark.parametrize(("spec", "batching", "value", "shape", "data"), [
    (TEXT, True, "hi", (1, 1), [b"hi"]),
    (TEXT, True, ["hi"], (1, 1), [b"hi"]),
    (TensorSpec("ids", "INT64", (-1, -1)), True, [1, 2, 3], (1, 3), [1, 2, 3]),
    (TensorSpec("ids", "INT64", (-1, 2, -1)), True, [1, 2, 3, 4], (1, 2, 2), [1, 2, 3, 4]),
    (TensorSpec("m", "FP32", (-1, 2, 2)), True, [[1, 2], [3, 4]], (1, 2, 2), [1, 2, 3, 4]),
    (TensorSpec("n", "INT32", (1,)), False, 7, (1,), [7]),
    (TensorSpec("flag", "BOOL", (-1, 1)), True, True, (1, 1), [True]),
])
def test_a_field_becomes_the_input_shaped_as_declared(spec: TensorSpec, batching: bool,
                                                      value: Any, shape: tuple[int, ...],
                                                      data: list[Any]) -> None:
    request = generate_request({spec.name: value}, (spec,), batching)
    array = request.inputs[spec.name]
    assert array.shape == shape and array.reshape(-1).tolist() == data


def test_other_fields_and_parameters_become_parameters() -> None:
    request = generate_request({"text_input": "a", "max_tokens": 2, "stream": True, "id": "r1",
                                "parameters": {"temperature": 0.2}}, (TEXT, TOKENS), True)
    assert request.parameters == {"temperature": 0.2, "stream": True, "id": "r1"}
    assert request.id == "r1" and set(request.inputs) == {"text_input", "max_tokens"}


@pytest.mark.parametrize(("doc", "named"), [
    ({"max_tokens": 1}, "has no field 'text_input'; the model's inputs are 'text_input' (BYTES)"),
    ({"text_input": [["a"], []], "max_tokens": 1}, "rectangular list"),
    ({"text_input": [], "max_tokens": 1}, "rectangular list"),
    ({"text_input": None, "max_tokens": 1}, "must be a string, number or boolean"),
    ({"text_input": "a", "max_tokens": 1.5}, "INT32"),
    ({"text_input": "a", "max_tokens": 1, "parameters": []}, "'parameters' must be a JSON"),
    ({"text_input": "a", "max_tokens": 1, "stop": {"at": "."}}, "parameter 'stop' must be"),
])
def test_bad_fields_are_named(doc: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidInput, match=named.replace("(", r"\(").replace(")", r"\)")):
        generate_request(doc, (TEXT, TOKENS), True)


def test_outputs_come_back_as_json_values() -> None:
    outputs = {"text_output": np.array([[b"caf\xc3\xa9 \xff"]], dtype=object),
               "scores": np.array([[0.5, 1.5]], np.float32),
               "count": np.array([[3]], np.int64),
               "grid": np.array([[[1, 2], [3, 4]]], np.int32)}
    doc = generate_response(InferResponse("m", "2", outputs), batching=True)
    assert doc == {"model_name": "m", "model_version": "2", "text_output": "café \ufffd",
                   "scores": [0.5, 1.5], "count": 3, "grid": [[1, 2], [3, 4]]}
    unbatched = generate_response(InferResponse("m", "1", {"n": np.array([5, 6])}), False)
    assert unbatched["n"] == [5, 6]


def _nested(levels: int, leaf: Any) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("levels", [33, 63])
def test_a_field_nested_past_32_lists_is_still_one_element(levels: int) -> None:
    request = generate_request({"text_input": _nested(levels, "a")}, (TEXT,), True)
    assert request.inputs["text_input"].reshape(-1).tolist() == [b"a"]


@pytest.mark.parametrize("doc", [
    {"text_input": _nested(1000, "a")},  # numpy stops at 64 dimensions: lists left inside
    {"text_input": "a", "x": _nested(1000, "a")},  # a parameter: repr() of it would recurse
    {"text_input": "a", "parameters": {"x": _nested(1000, 1)}},
])
def test_a_value_nested_1000_deep_is_refused_with_a_short_quote(doc: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput) as caught:
        generate_request(doc, (TEXT,), True)
    assert "must be a string, number or boolean" in caught.value.message
    assert "[[[[" in caught.value.message and len(caught.value.message) < 200
