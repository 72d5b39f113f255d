"""A request checked against a model's metadata: each refusal names what was wrong and what the
model expects."""

from __future__ import annotations

import numpy as np
import pytest

from serval.backends.base import ModelMetadata
from serval.backends.validation import same_dims, validate_request
from serval.errors import InvalidInput
from serval.protocol.types import InferRequest, RequestedOutput, TensorSpec

pytestmark = pytest.mark.unit

METADATA = ModelMetadata(platform="test", inputs=(TensorSpec("x", "FP32", (-1, 4)),),
                         outputs=(TensorSpec("y", "FP32", (-1, 2)),), max_batch_size=8)


def _request(**inputs: np.ndarray) -> InferRequest:
    return InferRequest(inputs)


def test_a_request_that_fits_passes() -> None:
    validate_request(_request(x=np.zeros((3, 4), np.float32)), METADATA, "m")


@pytest.mark.parametrize(("request_", "said"), [
    (_request(z=np.zeros((1, 4), np.float32)), "model 'm' has no input 'z'; expected inputs: "
                                               "x (FP32 [-1, 4])"),
    (_request(), "model 'm' needs input 'x' (FP32 [-1, 4])"),
    (_request(x=np.zeros((1, 4), np.float64)), "input 'x': datatype FP64 given, model expects "
                                               "FP32"),
    (_request(x=np.zeros((1, 5), np.float32)), "input 'x': shape [1, 5] given, model expects "
                                               "[-1, 4]"),
    (_request(x=np.zeros((9, 4), np.float32)), "input 'x': batch size 9 given, model accepts 1 "
                                               "to 8"),
    (InferRequest({"x": np.zeros((1, 4), np.float32)}, outputs=[RequestedOutput("w")]),
     "model 'm' has no output 'w'; outputs: y"),
])
def test_each_refusal_says_what_was_wrong(request_: InferRequest, said: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        validate_request(request_, METADATA, "m")
    assert said in str(refused.value)


def test_an_optional_input_may_be_left_out_but_is_checked_when_given() -> None:
    metadata = ModelMetadata(
        platform="test", inputs=(TensorSpec("x", "FP32", (-1, 4)),
                                 TensorSpec("bias", "FP32", (-1, 4), optional=True)),
        outputs=(TensorSpec("y", "FP32", (-1, 4)),), max_batch_size=8)
    validate_request(_request(x=np.zeros((2, 4), np.float32)), metadata, "m")
    validate_request(_request(x=np.zeros((2, 4), np.float32),
                              bias=np.ones((2, 4), np.float32)), metadata, "m")
    with pytest.raises(InvalidInput, match="input 'bias': datatype INT32 given"):
        validate_request(_request(x=np.zeros((2, 4), np.float32),
                                  bias=np.ones((2, 4), np.int32)), metadata, "m")
    with pytest.raises(InvalidInput, match="inputs disagree on the batch size"):
        validate_request(_request(x=np.zeros((2, 4), np.float32),
                                  bias=np.ones((3, 4), np.float32)), metadata, "m")
    with pytest.raises(InvalidInput, match="needs input 'x'"):
        validate_request(_request(bias=np.ones((2, 4), np.float32)), metadata, "m")


def test_inputs_that_share_a_named_dimension_must_agree_on_it() -> None:
    """ONNX names a free dimension (dim_param) once for every tensor that has it: an engine
    given two sizes fails mid-graph (a 500) or broadcasts one against the other."""
    inputs = [("ids", ["batch", "sequence"]), ("mask", ["batch", "sequence"]),
              ("extra", [None, 7, "other"])]
    named = same_dims(inputs, batched=False)
    assert named == (("batch", (("ids", 0), ("mask", 0))),
                     ("sequence", (("ids", 1), ("mask", 1))))
    # with a batch axis the batch size check covers axis 0: no group for it per request
    assert same_dims(inputs, batched=True) == (("sequence", (("ids", 1), ("mask", 1))),)
    spec = (-1, -1)
    metadata = ModelMetadata("test", (TensorSpec("ids", "INT64", spec),
                                      TensorSpec("mask", "INT64", spec)), (), 0,
                             same_dims=named)
    validate_request(_request(ids=np.zeros((2, 5), np.int64), mask=np.ones((2, 5), np.int64)),
                     metadata, "m")
    with pytest.raises(InvalidInput) as refused:
        validate_request(_request(ids=np.zeros((2, 5), np.int64),
                                  mask=np.ones((2, 3), np.int64)), metadata, "m")
    assert str(refused.value) == ("inputs disagree on dimension 'sequence', which the model "
                                  "gives them all: 'ids' axis 1: 5, 'mask' axis 1: 3")
