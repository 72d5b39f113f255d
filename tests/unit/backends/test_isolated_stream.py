"""Decoupled models in a worker process: responses cross the pipe as the model sends them,
the window holds the model's sender until the client takes responses, a cancellation reaches
the model while it runs, and a worker that dies ends its open streams with an error."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from serval.backends.base import ModelResponse, ModelVersionSpec, StreamRequest
from serval.backends.isolated_stream import IsolatedStreamModel, StreamingIsolatedBackend
from serval.backends.pipe_responses import recv_response, send_response
from serval.backends.python import PythonBackend
from serval.errors import BackendError, EngineRejectedInput
from serval.repository.triton_config import load_pbtxt
from tests import triton_decoupled_models as models

pytestmark = pytest.mark.unit

WAIT_S = 30.0


class Relayed:
    """A sink as the parent's relay sees it: responses forwarded, takes and cancels told."""

    def __init__(self, window: int = 4) -> None:
        self.window = window
        self.responses: list[ModelResponse] = []
        self.arrived = threading.Condition()
        self._taken: Callable[[], None] | None = None
        self._cancelled: Callable[[], None] | None = None
        self.cancelled = False

    def send(self, response: ModelResponse) -> bool:
        self.forward(response)
        return True

    def forward(self, response: ModelResponse) -> None:
        with self.arrived:
            self.responses.append(response)
            self.arrived.notify_all()

    def relay(self, taken: Callable[[], None], cancelled: Callable[[], None]) -> None:
        with self.arrived:  # the worker's first responses may come before this
            self._taken, self._cancelled = taken, cancelled
            self.arrived.notify_all()

    def is_cancelled(self) -> bool:
        return self.cancelled

    def take(self, count: int) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: self._taken is not None, WAIT_S)
        assert self._taken is not None
        for _ in range(count):
            self._taken()

    def cancel(self) -> None:
        self.cancelled = True
        assert self._cancelled is not None
        self._cancelled()

    def wait_for(self, condition: Callable[[list[ModelResponse]], bool]) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: condition(self.responses), WAIT_S)


def test_a_response_crosses_the_pipe_as_it_was_sent() -> None:
    parent, child = multiprocessing.Pipe()
    sent = [ModelResponse(outputs={"OUT": np.arange(3, dtype=np.int32)}),
            ModelResponse(error=EngineRejectedInput("bad", "detail")),
            ModelResponse(error=BackendError("failed")),
            ModelResponse(final=True)]
    for response in sent:
        send_response(child, 7, response)
    got = []
    for _ in sent:
        kind, stream_id, final, status = parent.recv()
        assert (kind, stream_id) == ("response", 7)
        got.append(recv_response(parent, final, status))
    assert got[0].outputs is not None and got[0].outputs["OUT"].tolist() == [0, 1, 2]
    assert isinstance(got[1].error, EngineRejectedInput) and got[1].error.detail == "detail"
    assert isinstance(got[2].error, BackendError) and got[2].error.message == "failed"
    assert got[3] == ModelResponse(final=True)


@pytest.fixture
def modes(tmp_path: Path) -> Iterator[tuple[IsolatedStreamModel, Path]]:
    folder = models.write(tmp_path, "modes", models.MODES_MODEL, models.MODES_PBTXT)
    spec = ModelVersionSpec("modes", "1", folder / "1", load_pbtxt(folder))
    model = StreamingIsolatedBackend(PythonBackend(allowed=True)).load(spec)
    assert isinstance(model, IsolatedStreamModel) and model.metadata.decoupled
    yield model, folder
    model.unload()


def _request(mode: str, n: int, sink: Relayed, request_id: str = "r") -> StreamRequest:
    return StreamRequest({"MODE": np.array([models.MODES[mode]], np.int32),
                          "N": np.array([n], np.int32)}, id=request_id, sink=sink)


def _values(sink: Relayed) -> list[int]:
    return [int(r.outputs["OUT"][0]) for r in sink.responses if r.outputs is not None]


def test_responses_stream_back_within_the_window(
        modes: tuple[IsolatedStreamModel, Path]) -> None:
    model, _ = modes
    sink = Relayed(window=2)
    results: list[object] = []
    runner = threading.Thread(target=lambda: results.extend(
        model.infer_requests([_request("bare_final", 5, sink)])))
    runner.start()
    sink.wait_for(lambda got: len(got) == 2)  # the model waits: the client took none
    assert _values(sink) == [0, 1] and not results
    sink.take(2)
    sink.wait_for(lambda got: len(got) == 4)
    sink.take(4)
    sink.wait_for(lambda got: bool(got) and got[-1].final)
    runner.join(WAIT_S)
    assert results == [{}] and _values(sink) == [0, 1, 2, 3, 4]
    assert sink.responses[-1] == ModelResponse(final=True)


def test_a_cancellation_reaches_the_model_while_it_runs(
        modes: tuple[IsolatedStreamModel, Path]) -> None:
    model, folder = modes
    sink = Relayed(window=1000)
    assert model.infer_requests([_request("until_cancelled", 0, sink, "gone")]) == [{}]
    sink.wait_for(lambda got: len(got) >= 3)  # execute returned; its thread still sends
    sink.cancel()
    marker = folder / "cancelled-gone"
    deadline = time.monotonic() + WAIT_S
    while not marker.exists():
        assert time.monotonic() < deadline, "the model never saw the cancellation"
        time.sleep(0.02)
    assert json.loads(marker.read_text())["request"] is True


def test_execute_raising_fails_the_batch(modes: tuple[IsolatedStreamModel, Path]) -> None:
    model, _ = modes
    with pytest.raises(BackendError, match="mode 3 raises"):
        model.infer_requests([_request("raise", 0, Relayed())])
    sink = Relayed()
    assert model.infer_requests([_request("final_with_last", 1, sink)]) == [{}]
    sink.wait_for(lambda got: bool(got) and got[-1].final)


def test_a_worker_that_dies_ends_its_open_streams(
        modes: tuple[IsolatedStreamModel, Path]) -> None:
    model, _ = modes
    sink = Relayed(window=1000)
    model.infer_requests([_request("until_cancelled", 0, sink)])
    sink.wait_for(lambda got: len(got) >= 1)
    process = model.isolated._process
    assert process is not None
    process.kill()
    sink.wait_for(lambda got: got[-1].final)
    assert isinstance(sink.responses[-1].error, BackendError)
    assert "worker process died" in sink.responses[-1].error.message
    after = Relayed()  # the worker restarts: the next request is served
    assert model.infer_requests([_request("final_with_last", 2, after)]) == [{}]
    after.wait_for(lambda got: bool(got) and got[-1].final)
    assert _values(after) == [0, 1]
