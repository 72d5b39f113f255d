"""Triton's behaviour where tritonclient users rely on it (issue 18): stream answers in request
order with ids and `triton_final_response`, ModelReady false for unknown versions, the
classification extension, strict readiness, and Triton's error words. tritonclient on both
transports against a real server.
"""

from __future__ import annotations

import queue
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call, infer

pytestmark = pytest.mark.integration

Factory = Callable[..., RunningServer]
LABELS = ["cat", "dog", "bird", "fish"]
LABELED = f"""\
max_batch_size: 32
labels: {{probabilities: {LABELS}}}
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton-compat")
    fixture_models.add_sub(root)
    fixture_models.linear(root)
    fixture_models.linear(root, "labeled", config=LABELED)
    fixture_models.slow(root)
    return root


@pytest.fixture(scope="module")
def server(server_factory: Factory, repository: Path) -> RunningServer:
    return server_factory(repository)  # strict readiness, the default: every model is READY


def _grpc_input(name: str, array: np.ndarray, datatype: str = "FP32") -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _http_input(name: str, array: np.ndarray, binary: bool = True) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


@pytest.fixture
def stream(server: RunningServer) -> Iterator[tuple[grpcclient.InferenceServerClient,
                                                    queue.Queue[tuple[object, object]]]]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    yield client, answers
    client.stop_stream()


# ModelStreamInfer ----------------------------------------------------------------------------

def test_stream_answers_in_request_order_while_requests_run_together(
        server: RunningServer, stream: tuple[grpcclient.InferenceServerClient,
                                             queue.Queue[tuple[object, object]]]) -> None:
    """A slow request first, fast ones behind it: the fast ones finish first but are answered
    after it, in the order they were sent, as Triton answers a non-decoupled model."""
    client, answers = stream
    slow = np.ones((128, 1024), np.float32)
    client.async_stream_infer("slow", [_grpc_input("x", slow)], request_id="0")
    a = np.ones((1, 16), np.float32)
    for index in range(1, 9):
        client.async_stream_infer("add_sub", [_grpc_input("INPUT0", a * index),
                                              _grpc_input("INPUT1", a)],
                                  request_id=str(index))
    received = [answers.get(timeout=60) for _ in range(9)]
    assert all(error is None for _, error in received)
    ids = [result.get_response().id for result, _ in received]  # type: ignore[attr-defined]
    assert ids == [str(index) for index in range(9)]
    for index, (result, _) in enumerate(received[1:], start=1):
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a * index + a)  # type: ignore[attr-defined]
    stats = call(server.url, "GET", "/v2/models/add_sub/stats").json()["model_stats"][0]
    assert int(stats["inference_count"]) >= 8  # the fast ones ran, not queued behind the slow


def test_stream_answers_are_final_responses_when_asked(
        stream: tuple[grpcclient.InferenceServerClient,
                      queue.Queue[tuple[object, object]]]) -> None:
    client, answers = stream
    a = np.ones((1, 16), np.float32)
    client.async_stream_infer("add_sub", [_grpc_input("INPUT0", a), _grpc_input("INPUT1", a)],
                              request_id="f", enable_empty_final_response=True)
    result, error = answers.get(timeout=30)
    assert error is None
    response = result.get_response()  # type: ignore[attr-defined]
    assert response.id == "f" and response.parameters["triton_final_response"].bool_param


def test_stream_errors_carry_the_request_id(server: RunningServer) -> None:
    """tritonclient's callback shows only the message, so read the raw stream."""
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    good = service_pb2.ModelInferRequest(model_name="add_sub", id="good")
    for name in ("INPUT0", "INPUT1"):
        tensor = good.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        tensor.contents.fp32_contents.extend([1.0] * 16)
    requests = [service_pb2.ModelInferRequest(model_name="nope", id="bad-1"), good,
                service_pb2.ModelInferRequest(model_name="add_sub", id="bad-2")]
    answers = list(stub.ModelStreamInfer(iter(requests), timeout=30))
    assert [answer.infer_response.id for answer in answers] == ["bad-1", "good", "bad-2"]
    first, second, third = answers
    assert first.error_message == "Request for unknown model: 'nope' is not found"
    assert first.infer_response.model_name == "nope"
    assert not second.error_message and third.error_message
    assert all(a.infer_response.parameters["triton_final_response"].bool_param for a in answers)


# ModelReady -----------------------------------------------------------------------------------

def test_model_ready_is_false_for_an_unknown_version(server: RunningServer) -> None:
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    http_client = httpclient.InferenceServerClient(server.url)
    for client in (grpc_client, http_client):
        assert client.is_model_ready("add_sub", "1")
        assert not client.is_model_ready("add_sub", "99")  # no exception: false, as Triton
        assert not client.is_model_ready("nope")
    reply = call(server.url, "GET", "/v2/models/add_sub/versions/99/ready")
    assert reply.status == 400 and reply.json() == {"name": "add_sub", "ready": False}


# classification -------------------------------------------------------------------------------

def _expected_classes(scores: np.ndarray, count: int, labels: list[str] | None) -> list[list[str]]:
    rows = []
    for row in scores:
        best = sorted(range(len(row)), key=lambda i: (-row[i], i))[:count]
        rows.append([f"{row[i]:f}:{i}" + (f":{labels[i]}" if labels else "") for i in best])
    return rows


@pytest.mark.parametrize(("model", "labels"), [("linear", None), ("labeled", LABELS)])
def test_class_count_answers_the_top_classes_over_grpc(
        server: RunningServer, model: str, labels: list[str] | None) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
    scores = client.infer(model, [_grpc_input("x", x)]).as_numpy("probabilities")
    result = client.infer(model, [_grpc_input("x", x)], outputs=[
        grpcclient.InferRequestedOutput("probabilities", class_count=2)])
    classes = result.as_numpy("probabilities")
    assert classes.shape == (3, 2)
    assert result.get_output("probabilities").datatype == "BYTES"
    assert [[c.decode() for c in row] for row in classes] == _expected_classes(scores, 2, labels)


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize(("model", "labels"), [("linear", None), ("labeled", LABELS)])
def test_class_count_answers_the_top_classes_over_http(
        server: RunningServer, model: str, labels: list[str] | None, binary: bool) -> None:
    client = httpclient.InferenceServerClient(server.url)
    x = np.random.default_rng(4).standard_normal((2, 8)).astype(np.float32)
    scores = client.infer(model, [_http_input("x", x)]).as_numpy("probabilities")
    result = client.infer(model, [_http_input("x", x, binary)], outputs=[
        httpclient.InferRequestedOutput("probabilities", binary_data=binary, class_count=2)])
    classes = result.as_numpy("probabilities")
    assert classes.shape == (2, 2)
    assert [[c.decode() if isinstance(c, bytes) else c for c in row] for row in classes] == (
        _expected_classes(scores, 2, labels))


def test_a_bad_class_count_is_refused(server: RunningServer) -> None:
    reply = infer(server.url, "linear", {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.0] * 8}],
        "outputs": [{"name": "probabilities", "parameters": {"classification": -1}}]})
    assert reply.status == 400 and "'classification'" in reply.error


# readiness ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def with_broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("readiness")
    fixture_models.add_sub(root)
    fixture_models.corrupt(root)
    return root


def _ready(server: RunningServer) -> tuple[int, bool, bool]:
    return (call(server.url, "GET", "/v2/health/ready").status,
            httpclient.InferenceServerClient(server.url).is_server_ready(),
            grpcclient.InferenceServerClient(server.grpc_url).is_server_ready())


def test_strict_readiness_is_503_while_a_model_is_unavailable(
        server_factory: Factory, with_broken: Path) -> None:
    strict = server_factory(with_broken)
    assert _ready(strict) == (503, False, False)
    reply = call(strict.url, "GET", "/v2/health/ready")
    assert "should serve" in reply.error and "corrupt" not in reply.error  # probes are open
    relaxed = server_factory(with_broken, "--no-strict-readiness")
    assert _ready(relaxed) == (200, True, True)


def test_explicit_readiness_follows_the_models_asked_for(
        server_factory: Factory, with_broken: Path) -> None:
    server = server_factory(with_broken, "--model-control", "explicit")
    assert _ready(server)[0] == 200  # nothing asked for yet
    for client in (httpclient.InferenceServerClient(server.url),
                   grpcclient.InferenceServerClient(server.grpc_url)):
        client.load_model("add_sub")
        assert client.is_server_ready()
        with pytest.raises(InferenceServerException, match="failed to load 'corrupt'"):
            client.load_model("corrupt")
        assert not client.is_server_ready()  # asked for, and not serving: as Triton
        client.unload_model("corrupt")
        assert client.is_server_ready()


def test_a_lazy_node_stays_ready_when_a_lazy_load_fails(
        server_factory: Factory, with_broken: Path) -> None:
    """A cluster node runs lazy behind HAProxy's /v2/health/ready check: one bad model must
    fail its own requests, never take the node out of rotation."""
    server = server_factory(with_broken, "--model-control", "lazy")
    reply = infer(server.url, "corrupt", {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.0] * 8}]})
    assert reply.status == 503 and "load failed" in reply.error
    assert _ready(server) == (200, True, True)
    client = httpclient.InferenceServerClient(server.url)
    a = np.ones((1, 16), np.float32)
    result = client.infer("add_sub", [_http_input("INPUT0", a), _http_input("INPUT1", a)])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + a)
    assert _ready(server) == (200, True, True)


PYTHON_STEP = """\
backend: python
max_batch_size: 32
inputs:
  - {name: x, datatype: FP32, dims: [4]}
outputs:
  - {name: y, datatype: FP32, dims: [4]}
"""
PIPELINE = """\
backend: pipeline
max_batch_size: 32
inputs:
  - {name: x, datatype: FP32, dims: [8]}
outputs:
  - {name: y, datatype: FP32, dims: [4]}
steps:
  - model: linear
    inputs: {x: x}
    outputs: {probabilities: p}
  - model: pystep
    inputs: {x: p}
    outputs: {y: y}
"""


def test_a_pipeline_whose_step_is_refused_is_unavailable_at_load(
        server_factory: Factory, repository: Path, tmp_path: Path) -> None:
    shutil.copytree(repository / "linear", tmp_path / "linear")
    for name, config in (("pystep", PYTHON_STEP), ("chain", PIPELINE)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.yaml").write_text(config)
    (tmp_path / "pystep" / "1" / "model.py").write_text("class Model: ...\n")
    server = server_factory(tmp_path)  # no --allow-python-models
    index = {entry["name"]: entry for entry in
             httpclient.InferenceServerClient(server.url).get_model_repository_index()}
    assert index["chain"]["state"] == "UNAVAILABLE"
    assert "step 2 cannot serve" in index["chain"]["reason"]
    assert "--allow-python-models" in index["pystep"]["reason"]
    assert index["linear"]["state"] == "READY"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert not client.is_model_ready("chain") and client.is_model_ready("linear")
    assert not client.is_server_ready()  # control all: every model should serve


# Triton's error words -------------------------------------------------------------------------

def test_error_texts_are_tritons(server: RunningServer) -> None:
    x = np.zeros((1, 8), np.float32)
    with pytest.raises(InferenceServerException,
                       match="Request for unknown model: 'nope' is not found"):
        httpclient.InferenceServerClient(server.url).infer("nope", [_http_input("x", x)])
    with pytest.raises(InferenceServerException,
                       match="Request for unknown model: 'nope' is not found"):
        grpcclient.InferenceServerClient(server.grpc_url).infer("nope", [_grpc_input("x", x)])
    with pytest.raises(InferenceServerException,
                       match="Request for unknown model: 'linear' version 7 is not found"):
        grpcclient.InferenceServerClient(server.grpc_url).infer(
            "linear", [_grpc_input("x", x)], model_version="7")
