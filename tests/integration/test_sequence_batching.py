"""Sequence batching on a real server, over HTTP and gRPC: a step-wise LSTM whose h and c the
server keeps equals the whole-sequence model; control and state tensors are hidden from
clients; each refusal is a precise 400 / INVALID_ARGUMENT or 429 / RESOURCE_EXHAUSTED."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from tests import sequence_lstm_models, triton_sequence_models
from tests.conftest import RunningServer

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.integration

TRANSPORTS = ["http", "grpc"]
STEPS = 6


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sequences")
    triton_sequence_models.build(root)
    return sequence_lstm_models.build(root)


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer], repository: Path) -> RunningServer:
    return server_factory(repository)


def _client(server: RunningServer, transport: str) -> Any:
    if transport == "http":
        return httpclient.InferenceServerClient(server.url, concurrency=8)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _module(transport: str) -> Any:
    return httpclient if transport == "http" else grpcclient


def _infer(client: Any, transport: str, model: str, name: str, data: np.ndarray,
           **sequence: Any) -> np.ndarray:
    module = _module(transport)
    tensor = module.InferInput(name, list(data.shape),
                               "FP32" if data.dtype == np.float32 else "INT32")
    tensor.set_data_from_numpy(data)
    result = client.infer(model, [tensor], **sequence)
    output = "H" if model.startswith("lstm") else "OUTPUT"
    answer: np.ndarray = result.as_numpy(output)
    return answer


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_step_wise_lstm_equals_the_whole_sequence_run(server: RunningServer, repository: Path,
                                                      transport: str) -> None:
    rng = np.random.default_rng(3)
    sequences = rng.normal(size=(5, STEPS, sequence_lstm_models.INPUT)).astype(np.float32)
    whole = ort.InferenceSession(str(repository / "lstm_whole" / "1" / "model.onnx"))
    (want,) = whole.run(["H"], {"X": sequences})
    offset = 100 if transport == "http" else 200

    def run(index: int) -> np.ndarray:
        client = _client(server, transport)
        answer = np.zeros(0, np.float32)
        for step in range(STEPS):
            answer = _infer(client, transport, "lstm_step", "X",
                            sequences[index:index + 1, step:step + 1],
                            sequence_id=offset + index, sequence_start=step == 0,
                            sequence_end=step == STEPS - 1)
        return answer

    with ThreadPoolExecutor(5) as pool:  # five sequences at once share batches
        got = np.concatenate(list(pool.map(run, range(5))))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_control_and_state_tensors_are_hidden(server: RunningServer, transport: str) -> None:
    client = _client(server, transport)
    for model, inputs, outputs in [("simple_dyna_sequence", ["INPUT"], ["OUTPUT"]),
                                   ("lstm_step", ["X"], ["H"])]:
        metadata = client.get_model_metadata(model)
        if transport == "grpc":
            names = ([t.name for t in metadata.inputs], [t.name for t in metadata.outputs])
        else:
            names = ([t["name"] for t in metadata["inputs"]],
                     [t["name"] for t in metadata["outputs"]])
        assert names == (inputs, outputs)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_config_yaml_sequence_model_shows_triton_sequence_batching(
        server: RunningServer, transport: str) -> None:
    """The model configuration extension shows config.yaml's sequence_batching in Triton's
    form (tritonclient parses it into Triton's ModelConfig), not a dynamic batcher."""
    shown = _client(server, transport).get_model_config("lstm_step")
    if transport == "grpc":
        from google.protobuf import json_format

        shown = json_format.MessageToDict(shown.config, preserving_proto_field_name=True)
    assert "dynamic_batching" not in shown
    batching = shown["sequence_batching"]
    assert int(batching["max_sequence_idle_microseconds"]) == 5_000_000
    assert "direct" in batching
    assert [(s["input_name"], s["output_name"], s["data_type"]) for s in batching["state"]] == [
        ("h_in", "h_out", "TYPE_FP32"), ("c_in", "c_out", "TYPE_FP32")]


def _refused(call: Callable[[], object], status: dict[str, str], transport: str,
             *words: str) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    message = str(caught.value.message())
    assert str(caught.value.status()) == status[transport], message
    for word in words:
        assert word in message
    return message


BAD = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
BUSY = {"http": "429", "grpc": "StatusCode.RESOURCE_EXHAUSTED"}
ONE = np.ones((1, 1), np.int32)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_sequence_requests_refused_precisely(server: RunningServer, transport: str) -> None:
    client = _client(server, transport)
    model = "simple_dyna_sequence"
    _refused(lambda: _infer(client, transport, model, "INPUT", ONE), BAD, transport,
             "sequence model", "sequence_id")
    _refused(lambda: _infer(client, transport, model, "INPUT", ONE, sequence_id=77),
             BAD, transport, "77", "not live", "sequence_start")
    _refused(lambda: _infer(client, transport, model, "INPUT", ONE, sequence_id="abc",
                            sequence_start=True), BAD, transport, "integer sequence ids",
             "UINT64")
    _refused(lambda: _infer(client, transport, model, "INPUT", np.ones((2, 1), np.int32),
                            sequence_id=78, sequence_start=True), BAD, transport, "batch size 1")
    _infer(client, transport, model, "INPUT", ONE, sequence_id=79, sequence_start=True,
           sequence_end=True)
    _refused(lambda: _infer(client, transport, model, "INPUT", ONE, sequence_id=79),
             BAD, transport, "not live")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_oldest_strategy_accumulates_and_bounds_candidates(server: RunningServer,
                                                           transport: str) -> None:
    """accumulate: oldest strategy, 2 candidate sequences, 300 ms idle."""
    client = _client(server, transport)
    base = 300 if transport == "http" else 400
    value = np.ones((1, 1), np.float32)
    for sequence_id in (base, base + 1):
        _infer(client, transport, "accumulate", "INPUT", value, sequence_id=sequence_id,
               sequence_start=True)
    assert _infer(client, transport, "accumulate", "INPUT", 2 * value,
                  sequence_id=base)[0][0] == 3.0
    _refused(lambda: _infer(client, transport, "accumulate", "INPUT", value,
                            sequence_id=base + 2, sequence_start=True, timeout=50_000),
             BUSY, transport, "all 2 sequence slots")
    client = _client(server, transport)  # a new connection: this one was told to wait
    _infer(client, transport, "accumulate", "INPUT", value, sequence_id=base,
           sequence_end=True)
    assert _infer(client, transport, "accumulate", "INPUT", 5 * value, sequence_id=base + 2,
                  sequence_start=True, sequence_end=True)[0][0] == 5.0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_sequence_starts_from_the_initial_state_in_its_data_file(
        server: RunningServer, transport: str) -> None:
    """initial_state { data_file: "start.bin" } (FP32 100): each new sequence's sum starts
    there, and a START of a live sequence goes back to it."""
    client = _client(server, transport)
    base = 500 if transport == "http" else 600
    value = np.ones((1, 1), np.float32)
    model = "accumulate_from_file"
    assert _infer(client, transport, model, "INPUT", value, sequence_id=base,
                  sequence_start=True)[0][0] == 101.0
    assert _infer(client, transport, model, "INPUT", 2 * value, sequence_id=base + 1,
                  sequence_start=True)[0][0] == 102.0
    assert _infer(client, transport, model, "INPUT", 3 * value, sequence_id=base)[0][0] == 104.0
    assert _infer(client, transport, model, "INPUT", value, sequence_id=base + 1,
                  sequence_start=True, sequence_end=True)[0][0] == 101.0
    _infer(client, transport, model, "INPUT", value, sequence_id=base, sequence_end=True)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_idle_sequence_is_freed_and_late_requests_fail(server: RunningServer,
                                                       transport: str) -> None:
    client = _client(server, transport)
    sequence_id = f"idle-{transport}"  # a string id
    value = np.ones((1, 1), np.float32)
    _infer(client, transport, "accumulate", "INPUT", value, sequence_id=sequence_id,
           sequence_start=True)
    time.sleep(0.35)  # the model's max_sequence_idle is 300 ms: the behaviour under test
    _refused(lambda: _infer(client, transport, "accumulate", "INPUT", value,
                            sequence_id=sequence_id), BAD, transport, "idle-", "idle",
             "sequence_start")
    assert _infer(client, transport, "accumulate", "INPUT", value, sequence_id=sequence_id,
                  sequence_start=True, sequence_end=True)[0][0] == 1.0
