"""Serval's own decoupled Python models: a generator infer sends each yielded dict as a
response, the final flag when it returns; an error ends the request; a cancelled request
closes the generator."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from serval.backends.base import ModelResponse, ModelVersionSpec, StreamRequest
from serval.backends.python import PythonBackend
from serval.backends.python_stream import GeneratorModel
from serval.errors import BackendError
from serval.model_config import load_model_config
from serval.protocol.types import InferRequest
from tests import triton_decoupled_models as models

pytestmark = pytest.mark.unit


class Collected:
    """A sink that keeps what it is sent; cancelled after `cancel_after` responses."""

    window = 8

    def __init__(self, cancel_after: int | None = None) -> None:
        self.responses: list[ModelResponse] = []
        self.cancel_after = cancel_after

    def send(self, response: ModelResponse) -> bool:
        self.responses.append(response)
        return True

    def forward(self, response: ModelResponse) -> None:
        self.responses.append(response)

    def relay(self, taken: Callable[[], None], cancelled: Callable[[], None]) -> None:
        pass

    def is_cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.responses) >= self.cancel_after


def _load(tmp_path: Path) -> GeneratorModel:
    folder = models.write_serval(tmp_path, "counter", models.COUNTER, models.COUNTER_CONFIG)
    spec = ModelVersionSpec("counter", "1", folder / "1",
                            load_model_config(folder / "config.yaml"))
    model = PythonBackend(allowed=True).load(spec)
    assert isinstance(model, GeneratorModel) and model.metadata.decoupled
    return model


def _request(n: int, sink: Collected) -> StreamRequest:
    return StreamRequest({"N": np.array([n], np.int32)}, sink=sink)


def _values(sink: Collected) -> list[int]:
    return [int(r.outputs["OUT"][0]) for r in sink.responses if r.outputs is not None]


def test_each_yield_is_a_response_and_the_end_is_the_final_flag(tmp_path: Path) -> None:
    model = _load(tmp_path)
    three, none = Collected(), Collected()
    assert model.infer_requests([_request(3, three), _request(0, none)]) == [{}, {}]
    assert _values(three) == [0, 1, 2] and three.responses[-1] == ModelResponse(final=True)
    assert none.responses == [ModelResponse(final=True)]


def test_an_error_in_the_generator_ends_its_request_with_it(tmp_path: Path) -> None:
    model = _load(tmp_path)
    sink = Collected()
    [failed] = model.infer_requests([_request(-3, sink)])
    assert isinstance(failed, BackendError) and "N < 0 fails" in failed.message
    assert _values(sink) == [0]


def test_a_cancelled_request_closes_the_generator(tmp_path: Path) -> None:
    model = _load(tmp_path)
    sink = Collected(cancel_after=2)
    assert model.infer_requests([_request(1000, sink)]) == [{}]
    assert _values(sink) == [0, 1]


def test_a_unary_request_is_refused(tmp_path: Path) -> None:
    model = _load(tmp_path)
    [refused] = model.infer_requests([InferRequest({"N": np.array([1], np.int32)})])
    assert isinstance(refused, BackendError) and "response stream" in refused.message
    with pytest.raises(BackendError, match="decoupled"):
        model.infer({"N": np.array([1], np.int32)})
