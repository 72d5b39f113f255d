"""Pipeline errors: a step's failure reaches the client without naming the step."""

from __future__ import annotations

import pytest

from serval.backends.base import ModelMetadata
from serval.backends.pipeline import in_step
from serval.errors import (
    BackendError,
    DeadlineExceeded,
    EngineRejectedInput,
    InvalidInput,
    ModelNotFound,
    ModelNotReady,
    Overloaded,
    ServalError,
)
from serval.model_config import PipelineStep
from serval.protocol.types import TensorSpec

pytestmark = pytest.mark.unit


def _pipeline() -> tuple[ModelMetadata, PipelineStep]:
    spec = TensorSpec("ids", "INT64", (-1, -1))
    metadata = ModelMetadata("ensemble", (spec,), (TensorSpec("y", "FP32", (-1, 4)),), 8)
    step = PipelineStep(model="secret_step", inputs={"tokens": "ids"}, outputs={"e": "y"})
    return metadata, step


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
    metadata, step = _pipeline()
    error = in_step(inner, metadata, "p", 1, step)
    assert type(error) is kind
    if isinstance(error, BackendError):  # the log keeps the step; the client sees this
        assert error.public_message == "pipeline 'p' failed to run the request"
    else:
        assert error.message == message
        assert "secret_step" not in error.message and "step" not in error.message
