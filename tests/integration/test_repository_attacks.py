"""The repository API as a careless or hostile client drives it, on a real server: overrides
that would make pipelines loop, config files too big to parse. Each bad load is the client's
400 and what served serves on."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
import tritonclient.grpc.service_pb2 as service
import tritonclient.grpc.service_pb2_grpc as service_grpc

from serval.model_config import MAX_CONFIG_BYTES
from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import Reply, call, infer

pytestmark = pytest.mark.integration

Factory = Callable[..., RunningServer]
X = {"inputs": [{"name": name, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}
                for name in ("INPUT0", "INPUT1")]}


def _steps(model: str) -> dict[str, Any]:
    """A pipeline's settings (config.yaml form) of one step on `model`, add_sub's tensors."""
    io = {"inputs": [{"name": n, "datatype": "FP32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
          "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "dims": [16]}]}
    return {"backend": "pipeline", "max_batch_size": 16, **io, "steps": [
        {"model": model, "inputs": {"INPUT0": "INPUT0", "INPUT1": "INPUT1"},
         "outputs": {"OUTPUT0": "OUTPUT0"}}]}


def _pipeline(root: Path, name: str, step: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.yaml").write_bytes(orjson.dumps(_steps(step)))  # JSON is YAML


def _load(server: RunningServer, name: str, config: dict[str, Any] | None = None) -> Reply:
    body = orjson.dumps({"parameters": {"config": config}}) if config else None
    return call(server.url, "POST", f"/v2/repository/models/{name}/load", body)


def test_an_override_that_makes_pipelines_loop_is_refused(server_factory: Factory,
                                                          tmp_path: Path) -> None:
    """outer runs on inner, inner on add_sub; an override of inner onto outer closes a loop.
    It was loaded (its loop checked against the folder's steps, not the override's), and then
    every request to either pipeline recursed until a 500, and no override could mend it."""
    fixture_models.add_sub(tmp_path)
    _pipeline(tmp_path, "inner", "add_sub")
    _pipeline(tmp_path, "outer", "inner")
    server = server_factory(tmp_path, "--model-control", "explicit")
    assert _load(server, "outer").status == 200
    assert infer(server.url, "outer", X).status == 200

    for looping in ("outer", "inner"):
        refused = _load(server, "inner", _steps(looping))
        assert refused.status == 400, refused.body
        assert f"pipeline steps loop: inner -> {looping}" in refused.error, refused.body
        for model in ("outer", "inner"):
            served = infer(server.url, model, X)
            assert served.status == 200, served.body
            assert served.json()["outputs"][0]["data"] == [2.0] * 16

    assert _load(server, "inner", _steps("add_sub")).status == 200  # a good override loads
    assert infer(server.url, "outer", X).status == 200


def test_a_loop_through_a_pipelines_loaded_steps_is_refused(server_factory: Factory,
                                                            tmp_path: Path) -> None:
    """outer serves on inner; its folder's config is then edited to run on add_sub, and not
    reloaded. An override of inner onto outer looked loop-free by the folder's config and
    loaded, while outer still ran on inner: each request recursed until a 500."""
    fixture_models.add_sub(tmp_path)
    _pipeline(tmp_path, "inner", "add_sub")
    _pipeline(tmp_path, "outer", "inner")
    server = server_factory(tmp_path, "--model-control", "explicit")
    assert _load(server, "outer").status == 200
    (tmp_path / "outer" / "config.yaml").write_bytes(orjson.dumps(_steps("add_sub")))

    refused = _load(server, "inner", _steps("outer"))
    assert refused.status == 400, refused.body
    assert "pipeline steps loop: inner -> outer -> inner" in refused.error, refused.body
    assert infer(server.url, "outer", X).status == 200

    assert _load(server, "outer").status == 200  # it runs on add_sub now
    assert _load(server, "inner", _steps("outer")).status == 200
    assert infer(server.url, "inner", X).status == 200


def test_a_config_past_the_limit_is_refused_and_the_server_stays_live(
        server_factory: Factory, tmp_path: Path) -> None:
    """A load whose files hold a config.pbtxt of ~1 MiB (20,000 inputs) parsed it on the event
    loop several times: ~10 s in which not even /v2/health/live answered. It is refused by its
    size, before it is parsed; so is a `config` parameter of that size."""
    model = fixture_models.add_sub(tmp_path)
    server = server_factory(tmp_path, "--model-control", "explicit")
    pbtxt = "".join(f'input {{ name: "i{n}" data_type: TYPE_FP32 dims: [1] }}\n'
                    for n in range(20_000))
    files = {"file:config.pbtxt": base64.b64encode(pbtxt.encode()).decode(),
             "file:1/model.onnx": base64.b64encode(model.read_bytes()).decode()}
    body = orjson.dumps({"parameters": {"config": "{}", **files}})
    refused = call(server.url, "POST", "/v2/repository/models/big/load", body)
    assert refused.status == 400, refused.body
    assert refused.error == (f"failed to load 'big': config.pbtxt: is larger than "
                             f"{MAX_CONFIG_BYTES} bytes, the most a model config may hold")
    # the same config in Triton's JSON form, as the parameter: ~3 s on the event loop
    inputs = [{"name": f"i{n}", "data_type": "TYPE_FP32", "dims": [1]} for n in range(20_000)]
    triton = {"name": "add_sub", "max_batch_size": 8, "input": inputs}
    refused = _load(server, "add_sub", triton)
    assert refused.status == 400, refused.body
    size = len(orjson.dumps(triton))
    assert refused.error == (f"failed to load 'add_sub': parameter 'config' holds {size} "
                             f"bytes of JSON; a model config may hold at most {MAX_CONFIG_BYTES}")
    assert call(server.url, "GET", "/v2/health/live").status == 200


def test_a_grpc_config_that_is_not_text_is_named_as_such(server_factory: Factory,
                                                         tmp_path: Path) -> None:
    """A `config` sent as an int64_param or bool_param was read as an empty string: 'not valid
    JSON: zero-length document', which is not what the client got wrong."""
    fixture_models.add_sub(tmp_path)
    server = server_factory(tmp_path, "--model-control", "explicit")
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_grpc.GRPCInferenceServiceStub(channel)
        for kind, value in (("int64_param", 5), ("bool_param", True)):
            request = service.RepositoryModelLoadRequest(model_name="add_sub")
            setattr(request.parameters["config"], kind, value)
            with pytest.raises(grpc.RpcError) as refused:
                stub.RepositoryModelLoad(request, timeout=30)
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details() == (
                "failed to load 'add_sub': parameter 'config' must be a string_param (the "
                f"config as JSON text), got {kind}")
        assert call(server.url, "GET", "/v2/models/add_sub/ready").status == 400  # not loaded


def test_a_warmup_that_would_never_end_is_refused_at_the_load(server_factory: Factory,
                                                              tmp_path: Path) -> None:
    """Triton's model_warmup count is a uint32: a load with 4,294,967,295 warm-up runs held a
    load slot and the model's lock for hours (two such loads stopped every other load)."""
    fixture_models.add_sub(tmp_path)
    server = server_factory(tmp_path, "--model-control", "explicit")
    assert _load(server, "add_sub").status == 200
    warmup = {"name": "forever", "batch_size": 1, "count": 4294967295,
              "inputs": {n: {"data_type": "TYPE_FP32", "dims": [16], "zero_data": True}
                         for n in ("INPUT0", "INPUT1")}}
    config = {"max_batch_size": 8, "model_warmup": [warmup]}
    refused = _load(server, "add_sub", config)
    assert refused.status == 400 and "1000" in refused.error, refused.body[:300]
    assert infer(server.url, "add_sub", X).status == 200  # what served serves on
    warmup["count"] = 3
    ran = _load(server, "add_sub", config)
    assert ran.status == 200, ran.body[:300]


def test_a_huge_config_value_is_not_echoed_whole(server_factory: Factory,
                                                 tmp_path: Path) -> None:
    """An unknown platform of 10 KB came back whole in the 400 (and in gRPC's grpc-message
    trailer, which grpcio refuses past 8 KiB: the client then saw another error)."""
    fixture_models.add_sub(tmp_path)
    server = server_factory(tmp_path, "--model-control", "explicit")
    refused = _load(server, "add_sub", {"platform": "p" * 10_000, "max_batch_size": 8})
    assert refused.status == 400 and "platform" in refused.error, refused.body[:300]
    assert len(refused.error) <= 2000 and "not supported" in refused.error
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    request = service.RepositoryModelLoadRequest(model_name="add_sub")
    request.parameters["config"].string_param = orjson.dumps(
        {"platform": "p" * 10_000}).decode()
    with pytest.raises(grpc.RpcError) as caught:
        service_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(request, timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not supported" in (caught.value.details() or "")
    channel.close()
