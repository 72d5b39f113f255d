"""Triton Python-backend models (TritonPythonModel + triton_python_backend_utils) served for
real, through tritonclient over HTTP and gRPC."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import triton_python_models as models
from tests.conftest import RunningServer
from tests.integration.stream_helpers import stream_responses

pytestmark = pytest.mark.integration

Client = Any  # tritonclient.http or tritonclient.grpc's InferenceServerClient
TRANSPORTS = ["http", "grpc"]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models.build_all(tmp_path_factory.mktemp("triton_python"))


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer], repository: Path) -> RunningServer:
    return server_factory(repository, "--allow-python-models")


def _client(server: RunningServer, transport: str) -> tuple[Client, Any]:
    if transport == "http":
        return httpclient.InferenceServerClient(server.url), httpclient
    return grpcclient.InferenceServerClient(server.grpc_url), grpcclient


def _input(module: Any, name: str, array: np.ndarray, datatype: str) -> Any:
    infer_input = module.InferInput(name, list(array.shape), datatype)
    infer_input.set_data_from_numpy(array)
    return infer_input


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("model", "datatype", "dtype"), [
    ("add_sub", "INT32", np.int32), ("add_sub_fp32", "FP32", np.float32),
    ("add_sub_pbtxt", "FP32", np.float32)])
def test_add_sub_answers_sum_and_difference(server: RunningServer, transport: str, model: str,
                                            datatype: str, dtype: type[Any]) -> None:
    client, module = _client(server, transport)
    a = np.arange(16, dtype=dtype).reshape(1, 16)
    b = np.ones((1, 16), dtype=dtype)
    result = client.infer(model, [_input(module, "INPUT0", a, datatype),
                                  _input(module, "INPUT1", b, datatype)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0").dtype == dtype


def test_metadata_and_config_come_from_the_declared_config(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    metadata = client.get_model_metadata("add_sub")
    assert metadata["platform"] == "python"
    assert metadata["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    assert client.get_model_config("add_sub")["max_batch_size"] == 8


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_strings_in_and_out(server: RunningServer, transport: str) -> None:
    client, module = _client(server, transport)
    a = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    b = np.array([[b"1"] * 16], dtype=np.object_)
    result = client.infer("simple_string", [_input(module, "INPUT0", a, "BYTES"),
                                            _input(module, "INPUT1", b, "BYTES")])
    assert result.as_numpy("OUTPUT0")[0].tolist() == [str(i + 1).encode() for i in range(16)]
    assert result.as_numpy("OUTPUT1")[0].tolist() == [str(i - 1).encode() for i in range(16)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_request_id_parameters_and_outputs_reach_the_model(server: RunningServer,
                                                          transport: str) -> None:
    client, module = _client(server, transport)
    x = np.array([[1, 2, 3]], dtype=np.int32)
    result = client.infer("checked", [_input(module, "INPUT0", x, "INT32")], request_id="r-1",
                          parameters={"color": "red"},
                          outputs=[module.InferRequestedOutput("SEEN")])
    seen = json.loads(result.as_numpy("SEEN")[0, 0])
    assert seen == {"id": "r-1", "parameters": {"color": "red"}, "correlation_id": 0,
                    "outputs": ["SEEN"]}
    assert result.as_numpy("OUTPUT0") is None  # not asked for


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_error_response_fails_only_its_own_request_of_the_batch(
        server: RunningServer, transport: str) -> None:
    client, module = _client(server, transport)
    before = _executions(server, "checked")
    results: dict[int, Any] = {}

    def send(index: int) -> None:
        x = np.full((1, 2), -1 if index == 2 else index, dtype=np.int32)
        own, _ = _client(server, transport)
        try:
            results[index] = own.infer("checked", [_input(module, "INPUT0", x, "INT32")])
        except InferenceServerException as exc:
            results[index] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    error = results.pop(2)
    assert isinstance(error, InferenceServerException)
    assert "INPUT0 must not be negative" in str(error)
    expected = "400" if transport == "http" else "StatusCode.INVALID_ARGUMENT"
    assert error.status() == expected
    for index, result in results.items():
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[2 * index] * 2])
    requests, executions = _executions(server, "checked")
    assert requests - before[0] == 4
    assert executions - before[1] < 4  # the 100 ms queue delay put them in shared batches
    del client


def _executions(server: RunningServer, model: str) -> tuple[int, int]:
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics(model)
    entry = stats["model_stats"][0]
    requests = entry["inference_stats"]["success"]["count"] + \
        entry["inference_stats"]["fail"]["count"]
    return int(requests), int(entry["execution_count"])


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_auto_complete_config_declares_the_tensors(server: RunningServer,
                                                   transport: str) -> None:
    client, module = _client(server, transport)
    metadata = httpclient.InferenceServerClient(server.url).get_model_metadata("auto")
    assert [i["name"] for i in metadata["inputs"]] == ["IN"]
    assert metadata["inputs"][0]["shape"] == [-1, 2]
    assert [o["name"] for o in metadata["outputs"]] == ["OUT", "ARGS"]
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    result = client.infer("auto", [_input(module, "IN", x, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUT"), x + 1)
    args = json.loads(result.as_numpy("ARGS")[0, 0])
    assert args["model_name"] == "auto" and args["model_version"] == "1"
    assert Path(args["model_repository"]).name == "auto"
    assert json.loads(args["model_config"])["max_batch_size"] == 4


def test_a_crash_fails_only_its_request_and_the_worker_comes_back(
        server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)

    def run(value: int) -> Any:
        x = np.full((1, 3), value, dtype=np.int32)
        return client.infer("crasher", [_input(httpclient, "INPUT0", x, "INT32")])

    first_pid = int(run(1).as_numpy("PID")[0, 0])
    with pytest.raises(InferenceServerException, match="worker process died"):
        run(13)
    assert int(run(2).as_numpy("PID")[0, 0]) != first_pid
    assert client.is_server_live()
    np.testing.assert_array_equal(  # the other models never noticed
        client.infer("add_sub", [
            _input(httpclient, "INPUT0", np.ones((1, 16), np.int32), "INT32"),
            _input(httpclient, "INPUT1", np.ones((1, 16), np.int32), "INT32"),
        ]).as_numpy("OUTPUT0"), np.full((1, 16), 2))


def test_finalize_runs_on_unload(server_factory: Callable[..., RunningServer],
                                 tmp_path: Path) -> None:
    folder = models.write(tmp_path, "auto", models.AUTO, models.AUTO_CONFIG)
    server = server_factory(tmp_path, "--allow-python-models", "--model-control", "explicit")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.load_model("auto")
    assert client.is_model_ready("auto")
    assert not (folder / "finalized").exists()
    client.unload_model("auto")
    deadline = time.monotonic() + 30
    while not (folder / "finalized").exists():
        assert time.monotonic() < deadline, "finalize() did not run on unload"
        time.sleep(0.05)
    assert not client.is_model_ready("auto")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_refused_without_the_flag_with_the_reason(server_factory: Callable[..., RunningServer],
                                                  tmp_path: Path, transport: str) -> None:
    models.add_sub(tmp_path)
    server = server_factory(tmp_path)
    client, module = _client(server, transport)
    assert not client.is_model_ready("add_sub")
    x = np.ones((1, 16), np.int32)
    with pytest.raises(InferenceServerException, match="--allow-python-models"):
        client.infer("add_sub", [_input(module, "INPUT0", x, "INT32"),
                                 _input(module, "INPUT1", x, "INT32")])


def test_a_model_decoupled_by_auto_complete_streams_and_refuses_unary_calls(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    models.write(tmp_path, "decoupled", models.DECOUPLED, models.AUTO_CONFIG)
    server = server_factory(tmp_path, "--allow-python-models")
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_model_ready("decoupled")
    x = np.full((1,), 2.0, np.float32)
    with pytest.raises(InferenceServerException, match=r"model 'decoupled' is decoupled"):
        client.infer("decoupled", [_input(httpclient, "IN", x, "FP32")])
    answers = stream_responses(server.grpc_url, "decoupled",
                               [_input(grpcclient, "IN", x, "FP32")], 2)
    assert [a.as_numpy("OUT").tolist() for a in answers] == [[4.0], [6.0]]
    assert [a.get_response().parameters["triton_final_response"].bool_param
            for a in answers] == [False, True]


def test_an_optional_input_may_be_left_out_and_such_requests_batch_apart(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    models.write_pbtxt(tmp_path, "optional", models.OPTIONAL, models.OPTIONAL_PBTXT)
    server = server_factory(tmp_path, "--allow-python-models")
    config = httpclient.InferenceServerClient(server.url).get_model_config("optional")
    assert [t.get("optional", False) for t in config["input"]] == [False, True]
    answers: dict[int, Any] = {}

    def ask(index: int) -> None:  # half the clients send BIAS, all at once
        client = grpcclient.InferenceServerClient(server.grpc_url)
        x = np.full((1, 4), float(index), np.float32)
        inputs = [_input(grpcclient, "X", x, "FP32")]
        if index % 2:
            inputs.append(_input(grpcclient, "BIAS", np.ones((1, 4), np.float32), "FP32"))
        answers[index] = client.infer("optional", inputs)

    threads = [threading.Thread(target=ask, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for index, result in answers.items():
        np.testing.assert_array_equal(result.as_numpy("OUT"), [[index + index % 2] * 4])
        assert result.as_numpy("WITH_BIAS").tolist() == [[bool(index % 2)]]
    assert len(answers) == 8
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="needs input 'X'"):
        client.infer("optional", [_input(httpclient, "BIAS", np.ones((1, 4), np.float32),
                                         "FP32")])
