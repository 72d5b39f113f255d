"""Client-caused errors, one function at a time: shapes, headers, engine errors, model names,
reasons without paths, pipeline errors, and the two transports' error tables."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from serval.backends.base import ModelMetadata, TensorSpec
from serval.backends.onnxruntime import rejected_input
from serval.backends.pipeline import PipelineModel
from serval.config import PipelineStep
from serval.dataplane import _in_step
from serval.errors import (
    BackendError,
    DeadlineExceeded,
    EngineRejectedInput,
    ErrorCode,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    ServalError,
)
from serval.protocol.shapes import check_shape
from serval.repository.registry import ModelRegistry, check_requested_name
from serval.server.grpc.errors import GRPC_STATUS
from serval.server.http.app import _decompress, _header_length, _timeout_ms
from serval.server.http.errors import HTTP_STATUS

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("shape", "expected"), [
    ([1] * 65, "65 dimensions; a tensor may have at most 64"),
    ([0, 2**63], "beyond 9223372036854775807"),
    ([0, -1], "negative dimension"),
    ([0, 2**40, 2**40], "spans more than 2**56 elements"),
    ([1.0], "list of non-negative integers"),
    ([True], "list of non-negative integers"),
])
def test_hostile_shapes_are_refused_with_the_limit(shape: list[object], expected: str) -> None:
    with pytest.raises(InvalidInput, match=expected.replace("*", r"\*")):
        check_shape(shape, "x")


def test_the_largest_allowed_shapes_pass() -> None:
    assert check_shape([1] * 64, "x") == (1,) * 64
    assert check_shape([0, 2**56], "x") == (0, 2**56)
    assert check_shape([2**28, 2**28], "x") == (2**28, 2**28)


@pytest.mark.parametrize("value", [b"inf", b"nan", b"1e308", b"-1", b"0", b"\xff", b"86400001"])
def test_timeouts_must_be_finite_positive_and_at_most_a_day(value: bytes) -> None:
    with pytest.raises(InvalidInput, match="at most 86400000"):
        _timeout_ms(value)


def test_a_timeout_within_bounds_is_taken() -> None:
    assert _timeout_ms(b"86400000") == 86_400_000.0
    assert _timeout_ms(b" 2.5 ") == 2.5


@pytest.mark.parametrize("value", [b"\xff\xfe", b"-1", b"1_0", b"+5", b"9" * 20, b""])
def test_header_lengths_are_plain_ascii_integers(value: bytes) -> None:
    with pytest.raises(InvalidInput, match="must be a non-negative integer"):
        _header_length(value)
    assert _header_length(b" 12 ") == 12


def test_a_non_utf8_content_encoding_is_shown_escaped() -> None:
    with pytest.raises(InvalidInput) as caught:
        _decompress(b"x", b"\xff\xfe", 100)
    assert caught.value.message.startswith("Content-Encoding '\\xff\\xfe' is not supported")


def test_ort_invalid_argument_becomes_a_400_without_node_names() -> None:
    error = rejected_input(
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while "
        "running Gather node. Name:'/encoder/embed/Gather' Status Message: indices element out "
        "of data bounds, idx=99 must be within the inclusive range [-16,15]")
    assert isinstance(error, EngineRejectedInput) and error.code is ErrorCode.INVALID_INPUT
    assert "(Gather): indices element out of data bounds, idx=99" in error.message
    assert "vocabulary" in error.message and "/encoder" not in error.message
    assert error.detail.startswith("indices element out of data bounds")


@pytest.mark.parametrize(("name", "expected"), [
    ("m" * 256, "256 bytes is too long"), ("é" * 128, "256 bytes is too long"),
    ("a/b", "may not contain"), ("a\\b", "may not contain"), ("a\x00b", "may not contain"),
    ("\udcff", "valid Unicode"),
])
def test_names_no_folder_can_have_are_refused(name: str, expected: str) -> None:
    with pytest.raises(InvalidInput, match=expected):
        check_requested_name(name)
    check_requested_name("m" * 255)


def test_reasons_lose_the_repository_path(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path, {})
    reason = registry.public_reason(
        f"Load model from {tmp_path}/m/1/model.onnx failed; see /usr/lib/x/libfoo.so")
    assert reason == "Load model from m/1/model.onnx failed; see libfoo.so"


def _pipeline() -> tuple[PipelineModel, PipelineStep]:
    spec = TensorSpec("ids", "INT64", (-1, -1))
    metadata = ModelMetadata("ensemble", (spec,), (TensorSpec("y", "FP32", (-1, 4)),), 8)
    step = PipelineStep(model="secret_step", inputs={"tokens": "ids"}, outputs={"e": "y"})
    return PipelineModel(metadata, (step,)), step


@pytest.mark.parametrize(("inner", "kind", "message"), [
    (EngineRejectedInput("x", "idx=99 out of range"), InvalidInput,
     "pipeline 'p' cannot compute on the values of input 'ids': idx=99 out of range"),
    (InvalidInput("input 'tokens': shape [3] given, model expects [-1, -1]"), InvalidInput,
     "pipeline 'p': input 'ids': shape [3] given, model expects [-1, -1]"),
    (InvalidInput("model 'secret_step' has no input 'tokens'"), BackendError,
     "pipeline 'p' step 1 ('secret_step'): model 'secret_step' has no input 'tokens'"),
    (BackendError("model 'secret_step' failed to run the batch"), BackendError, None),
    (ModelNotFound("unknown model 'secret_step'"), ModelNotReady,
     "pipeline 'p' cannot serve now: one of its models is not ready"),
    (Overloaded("model 'secret_step' has 9 requests queued"), Overloaded,
     "pipeline 'p' is overloaded; retry shortly"),
    (DeadlineExceeded("queued too long in 'secret_step'"), DeadlineExceeded,
     "the request's deadline passed while pipeline 'p' ran it"),
])
def test_pipeline_errors_never_name_a_step_to_the_client(
        inner: ServalError, kind: type[ServalError], message: str | None) -> None:
    pipeline, step = _pipeline()
    error = _in_step(inner, pipeline, "p", 1, step)
    assert type(error) is kind
    if isinstance(error, BackendError):  # the log keeps the step; the client sees this
        assert error.public_message == "pipeline 'p' failed to run the request"
    else:
        assert error.message == message
        assert "secret_step" not in error.message and "step" not in error.message


def test_both_transports_map_every_error_code_alike() -> None:
    pairs = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
             403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
             429: grpc.StatusCode.RESOURCE_EXHAUSTED, 500: grpc.StatusCode.INTERNAL,
             503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}
    assert set(HTTP_STATUS) == set(GRPC_STATUS) == set(ErrorCode)
    for code in ErrorCode:
        assert pairs[HTTP_STATUS[code]] is GRPC_STATUS[code], code
