"""ONNX Runtime's own errors on bad input values become a client's 400 without node names."""

from __future__ import annotations

import pytest

from serval.backends.onnxruntime import rejected_input
from serval.errors import EngineRejectedInput, ErrorCode

pytestmark = pytest.mark.unit


def test_ort_invalid_argument_becomes_a_400_without_node_names() -> None:
    error = rejected_input(
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while "
        "running Gather node. Name:'/encoder/embed/Gather' Status Message: indices element out "
        "of data bounds, idx=99 must be within the inclusive range [-16,15]")
    assert isinstance(error, EngineRejectedInput) and error.code is ErrorCode.INVALID_INPUT
    assert "(Gather): indices element out of data bounds, idx=99" in error.message
    assert "vocabulary" in error.message and "/encoder" not in error.message
    assert error.detail.startswith("indices element out of data bounds")
