"""Triton's repository API with overrides, through tritonclient on both transports: a config
override (Triton's JSON form) reloads a served model until unload; files load a model from bytes
(a new name too); garbage files fail to load and the old version keeps serving; paths leaving the
model's folder are the client's 400; only the control (admin) scope may load."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests import fixture_models
from tests import triton_python_models as models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call, infer

pytestmark = pytest.mark.integration

Secured = tuple[RunningServer, dict[str, str]]


def _token(tokens: Path, scope: str) -> str:
    result = subprocess.run([sys.executable, "-m", "serval", "token", "create", "--tokens-file",
                             str(tokens), "--name", scope, "--scope", scope],
                            capture_output=True, text=True, timeout=60, check=True)
    return result.stdout.strip()


@pytest.fixture(scope="module")
def secured(server_factory: Callable[..., RunningServer],
            tmp_path_factory: pytest.TempPathFactory) -> Secured:
    root = tmp_path_factory.mktemp("overrides")
    fixture_models.linear(root, config="max_batch_size: 32\n")
    fixture_models.linear(root, "grpc_linear", config="max_batch_size: 32\n")
    fixture_models.add_sub(root)
    tokens_file = root.parent / f"{root.name}-tokens.yaml"
    tokens = {scope: _token(tokens_file, scope) for scope in ("admin", "read")}
    server = server_factory(root, "--auth-tokens", str(tokens_file), "--model-control",
                            "explicit")
    return server, tokens


@pytest.fixture(scope="module")
def onnx_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return fixture_models.linear(tmp_path_factory.mktemp("bytes"), seed=7).read_bytes()


def _admin(secured: Secured, scope: str = "admin") -> dict[str, str]:
    return {"Authorization": f"Bearer {secured[1][scope]}"}


def _grpc_admin(secured: Secured, scope: str = "admin") -> dict[str, str]:
    return {"authorization": f"Bearer {secured[1][scope]}"}  # gRPC metadata is lower case


def _rows(batch: int) -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [batch, 8],
                        "data": [0.5] * 8 * batch}]}


def _http_infer(client: triton.InferenceServerClient, model: str, batch: int,
                headers: dict[str, str]) -> np.ndarray:
    given = triton.InferInput("x", [batch, 8], "FP32")
    given.set_data_from_numpy(np.full((batch, 8), 0.5, dtype=np.float32))
    result = client.infer(model, [given], headers=headers).as_numpy("probabilities")
    assert result is not None
    return result


def _grpc_infer(client: triton_grpc.InferenceServerClient, model: str, batch: int,
                headers: dict[str, str]) -> np.ndarray:
    given = triton_grpc.InferInput("x", [batch, 8], "FP32")
    given.set_data_from_numpy(np.full((batch, 8), 0.5, dtype=np.float32))
    result = client.infer(model, [given], headers=headers).as_numpy("probabilities")
    assert result is not None
    return result


def test_http_config_override_reloads_without_failed_requests_until_unload(
        secured: Secured) -> None:
    server, headers = secured[0], _admin(secured)
    client = triton.InferenceServerClient(server.url)
    client.load_model("linear", headers=headers)
    config = client.get_model_config("linear", headers=headers)  # Triton's JSON form
    assert config["max_batch_size"] == 32
    statuses: list[int] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            statuses.append(infer(server.url, "linear", _rows(1), headers).status)

    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        client.load_model("linear", headers=headers,
                          config=json.dumps({**config, "max_batch_size": 2}))
    finally:
        stop.set()
        sender.join(timeout=30)
    assert statuses and set(statuses) == {200}  # no failed request across the reload
    assert client.get_model_config("linear", headers=headers)["max_batch_size"] == 2
    assert _http_infer(client, "linear", 2, headers).shape == (2, 4)
    with pytest.raises(InferenceServerException, match="batch size 3 given, model accepts 1 "
                                                       "to 2"):
        _http_infer(client, "linear", 3, headers)
    client.unload_model("linear", headers=headers)
    client.load_model("linear", headers=headers)  # the folder's config again
    assert client.get_model_config("linear", headers=headers)["max_batch_size"] == 32
    assert _http_infer(client, "linear", 3, headers).shape == (3, 4)


def test_grpc_config_override_in_triton_json_form(secured: Secured) -> None:
    server, headers = secured[0], _grpc_admin(secured)
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    client.load_model("grpc_linear", headers=headers)
    config = client.get_model_config("grpc_linear", headers=headers, as_json=True)["config"]
    client.load_model("grpc_linear", headers=headers,
                      config=json.dumps({**config, "max_batch_size": 3}))
    reloaded = client.get_model_config("grpc_linear", headers=headers).config
    assert reloaded.max_batch_size == 3
    with pytest.raises(InferenceServerException, match="model accepts 1 to 3"):
        _grpc_infer(client, "grpc_linear", 4, headers)
    client.load_model("grpc_linear", headers=headers,
                      config=json.dumps({"max_batch_size": 5}))  # config.yaml form still
    assert client.get_model_config("grpc_linear", headers=headers).config.max_batch_size == 5
    client.unload_model("grpc_linear", headers=headers)
    client.load_model("grpc_linear", headers=headers)
    assert client.get_model_config("grpc_linear", headers=headers).config.max_batch_size == 32


def test_http_files_load_a_new_model_and_garbage_keeps_the_old_one(
        secured: Secured, onnx_bytes: bytes) -> None:
    server, headers = secured[0], _admin(secured)
    client = triton.InferenceServerClient(server.url)
    config = json.dumps({"name": "uploaded", "backend": "onnxruntime", "max_batch_size": 4})
    client.load_model("uploaded", headers=headers, config=config,
                      files={"file:1/model.onnx": onnx_bytes})
    assert client.is_model_ready("uploaded", headers=headers)
    before = _http_infer(client, "uploaded", 1, headers)
    assert client.get_model_config("uploaded", headers=headers)["max_batch_size"] == 4
    with pytest.raises(InferenceServerException, match="failed to load 'uploaded'") as caught:
        client.load_model("uploaded", headers=headers, config=config,
                          files={"file:1/model.onnx": b"not an onnx model"})
    assert "serval-load" not in str(caught.value)  # no path of the server's private folder
    np.testing.assert_array_equal(_http_infer(client, "uploaded", 1, headers), before)
    client.unload_model("uploaded", headers=headers)
    with pytest.raises(InferenceServerException,
                       match="failed to load 'uploaded': no model folder"):
        client.load_model("uploaded", headers=headers)  # the files went with the unload


def test_grpc_files_replace_a_served_model_and_garbage_fails_to_load(
        secured: Secured, onnx_bytes: bytes) -> None:
    server, headers = secured[0], _grpc_admin(secured)
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    client.load_model("add_sub", headers=headers)
    config = json.dumps({"name": "add_sub", "platform": "onnxruntime_onnx",
                         "max_batch_size": 8})
    client.load_model("add_sub", headers=headers, config=config,
                      files={"file:1/model.onnx": onnx_bytes})  # now a linear model
    assert [t.name for t in client.get_model_metadata("add_sub", headers=headers).inputs] == [
        "x"]
    served = _grpc_infer(client, "add_sub", 2, headers)
    with pytest.raises(InferenceServerException, match="failed to load 'add_sub'"):
        client.load_model("add_sub", headers=headers, config=config,
                          files={"file:1/model.onnx": b"\x00garbage"})
    np.testing.assert_array_equal(_grpc_infer(client, "add_sub", 2, headers), served)
    client.load_model("grpc_new", headers=headers, config=json.dumps({"max_batch_size": 2}),
                      files={"file:1/model.onnx": onnx_bytes})
    assert _grpc_infer(client, "grpc_new", 2, headers).shape == (2, 4)


def test_a_path_leaving_the_model_folder_is_the_clients_400(secured: Secured) -> None:
    server, headers = secured[0], _admin(secured)
    body = orjson.dumps({"parameters": {
        "config": '{"max_batch_size": 2}',
        "file:1/../../x": base64.b64encode(b"x").decode()}})
    reply = call(server.url, "POST", "/v2/repository/models/linear/load", body, headers)
    assert reply.status == 400
    assert "parameter 'file:1/../../x'" in reply.error and "'..'" in reply.error
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match=r"may not contain '\.\.'") as caught:
        client.load_model("linear", headers=_grpc_admin(secured), config="{}",
                          files={"file:1/../../x": b"x"})
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    reply = call(server.url, "POST", "/v2/repository/models/linear/load", orjson.dumps(
        {"parameters": {"config": "{}", "file:1/model.onnx": "not base64!"}}), headers)
    assert reply.status == 400 and "base64" in reply.error


def test_only_the_control_scope_may_load_with_overrides(secured: Secured,
                                                        onnx_bytes: bytes) -> None:
    server = secured[0]
    reader = _admin(secured, "read")
    body = orjson.dumps({"parameters": {
        "config": '{"max_batch_size": 2}',
        "file:1/model.onnx": base64.b64encode(onnx_bytes).decode()}})
    reply = call(server.url, "POST", "/v2/repository/models/stolen/load", body, reader)
    assert reply.status == 403 and "may not admin" in reply.error
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("stolen", headers=_grpc_admin(secured, "read"), config="{}",
                          files={"file:1/model.onnx": onnx_bytes})
    assert caught.value.status() == str(grpc.StatusCode.PERMISSION_DENIED)
    index = triton.InferenceServerClient(server.url).get_model_repository_index(
        headers=reader)
    assert "stolen" not in {entry["name"] for entry in index}


def test_a_triton_python_model_loads_from_files(server_factory: Callable[..., RunningServer],
                                                tmp_path: Path) -> None:
    server = server_factory(tmp_path, "--model-control", "explicit", "--allow-python-models")
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    tensors = [{"name": name, "data_type": "TYPE_FP32", "dims": [16]}
               for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")]
    config = {"name": "py_add_sub", "backend": "python", "max_batch_size": 8,
              "input": tensors[:2], "output": tensors[2:]}
    client.load_model("py_add_sub", config=json.dumps(config),
                      files={"file:1/model.py": models.ADD_SUB.encode()})
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    inputs = [triton_grpc.InferInput(name, [1, 16], "FP32") for name in ("INPUT0", "INPUT1")]
    for given in inputs:
        given.set_data_from_numpy(x)
    result = client.infer("py_add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + x)
    assert not any(tmp_path.iterdir())  # nothing written into the repository


def test_a_bad_config_parameter_is_named_as_the_parameter_not_a_file(secured: Secured) -> None:
    """A `config` whose inputs the model lacks was blamed on add_sub/config.pbtxt, a file the
    model does not have (Triton's form) or that holds no inputs (config.yaml settings)."""
    server, _ = secured
    triton = {"name": "add_sub", "max_batch_size": 8,
              "input": [{"name": "a", "data_type": "TYPE_FP32", "dims": [16]}]}
    settings = {"max_batch_size": 8, "inputs": [{"name": "a", "datatype": "FP32", "dims": [16]}]}
    lacks = "input 'a' is not an input of the model (it has INPUT0, INPUT1)"
    for config, source in ((triton, "parameter 'config'"),
                           (settings, "add_sub/config.yaml with parameter 'config' over it")):
        refused = call(server.url, "POST", "/v2/repository/models/add_sub/load",
                       orjson.dumps({"parameters": {"config": config}}), _admin(secured))
        assert refused.status == 400, refused.body
        assert refused.error == (f"failed to load 'add_sub': version 1: load failed: {source}: "
                                 f"{lacks}")


def test_a_large_config_parameter_is_refused_with_its_reason(secured: Secured) -> None:
    """A `config` of 3,000 inputs (190 KB, under the 256 KiB bound), converted on a thread
    (on the event loop it held /v2/health/live 0.28-0.47 s a load: bench/loop_stalls.py): the
    load answers the same 400 as a small one, each time."""
    server, _ = secured
    config = {"name": "add_sub", "max_batch_size": 8,
              "input": [{"name": f"in{index}", "data_type": "TYPE_FP32", "dims": [1, 2, 3]}
                        for index in range(3000)]}
    body = orjson.dumps({"parameters": {"config": orjson.dumps(config).decode()}})
    for _ in range(2):
        refused = call(server.url, "POST", "/v2/repository/models/add_sub/load", body,
                       _admin(secured))
        assert refused.status == 400, refused.body
        assert "input 'in0' is not an input of the model" in refused.error
