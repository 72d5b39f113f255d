"""Model control on a real server: versions, lazy loads, LRU eviction, repository API, swaps."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call, infer, metric, wait_until_running

pytestmark = pytest.mark.integration

Factory = Callable[..., RunningServer]
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}


def _states(server: RunningServer) -> dict[str, str]:
    index = call(server.url, "POST", "/v2/repository/index").json()
    return {f"{e['name']}/{e['version']}": e["state"] for e in index}


def _linear_versions(root: Path, name: str, versions: list[int], config: str) -> None:
    for version in versions:
        path = fixture_models.linear(root, name=name, config=config, seed=version)
        if str(version) != "1":
            target = path.parent.parent / str(version)
            shutil.rmtree(target, ignore_errors=True)
            path.parent.rename(target)


def test_version_policy_and_version_routing(server_factory: Factory, tmp_path: Path) -> None:
    policy = "max_batch_size: 8\nversion_policy:\n  latest: 2\n"
    _linear_versions(tmp_path, "clf", [1, 2, 3], policy)
    server = server_factory(tmp_path)
    assert call(server.url, "GET", "/v2/models/clf").json()["versions"] == ["2", "3"]
    assert infer(server.url, "clf", X).json()["model_version"] == "3"
    two = call(server.url, "POST", "/v2/models/clf/versions/2/infer", orjson.dumps(X)).json()
    three = call(server.url, "POST", "/v2/models/clf/versions/3/infer", orjson.dumps(X)).json()
    assert two["model_version"] == "2"
    assert two["outputs"][0]["data"] != three["outputs"][0]["data"]  # distinct weights
    assert call(server.url, "POST", "/v2/models/clf/versions/1/infer",
                orjson.dumps(X)).status == 404


def test_tritonclient_repository_calls_in_explicit_mode(server_factory: Factory,
                                                        tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    fixture_models.add_sub(tmp_path)
    server = server_factory(tmp_path, "--model-control", "explicit")
    client = triton.InferenceServerClient(server.url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["linear"]["state"] == "UNAVAILABLE" and not client.is_model_ready("linear")
    assert infer(server.url, "linear", X).status == 503
    client.load_model("linear", config=orjson.dumps({"max_batch_size": 4}).decode())
    assert client.is_model_ready("linear")
    assert client.get_model_config("linear")["max_batch_size"] == 4
    assert infer(server.url, "linear", X).status == 200
    client.unload_model("linear")
    assert not client.is_model_ready("linear")
    assert "unloaded" in infer(server.url, "linear", X).error
    with pytest.raises(InferenceServerException, match="failed to load 'nope'"):
        client.load_model("nope")


def test_grpc_repository_calls(server_factory: Factory, tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    server = server_factory(tmp_path, "--model-control", "explicit")
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    assert client.get_model_repository_index(as_json=True)["models"][0]["name"] == "linear"
    client.load_model("linear")
    assert client.is_model_ready("linear")
    client.unload_model("linear")
    assert not client.is_model_ready("linear")


def test_lazy_mode_loads_once_on_concurrent_first_requests(server_factory: Factory,
                                                           tmp_path: Path) -> None:
    for index in range(3):
        fixture_models.heavy(tmp_path, name=f"m{index}", layers=20, width=384)
    server = server_factory(tmp_path, "--model-control", "lazy")
    assert set(_states(server).values()) == {"UNAVAILABLE"}
    assert metric(server.url, "serval_model_loads_total") == 0
    doc = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 384],
                                    "data": [0.1] * 384}]})
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda: statuses.append(
        call(server.url, "POST", "/v2/models/m0/infer", doc).status)) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert statuses == [200] * 16
    assert metric(server.url, "serval_model_loads_total") == 1
    assert metric(server.url, "serval_model_cache_misses_total") == 16  # all waited for one load
    assert metric(server.url, "serval_model_load_duration_seconds_count") == 1
    assert _states(server)["m0/1"] == "READY" and _states(server)["m1/1"] == "UNAVAILABLE"


def test_lru_eviction_under_a_memory_budget(server_factory: Factory, tmp_path: Path) -> None:
    for index in range(3):
        fixture_models.heavy(tmp_path, name=f"m{index}", layers=8, width=256)  # ~2.5 MB each
    server = server_factory(tmp_path, "--model-control", "lazy", "--memory-budget", "6MB")
    doc = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 256],
                                    "data": [0.1] * 256}]})
    for name in ("m0", "m1", "m2"):
        assert call(server.url, "POST", f"/v2/models/{name}/infer", doc).status == 200
    states = _states(server)
    assert states["m0/1"] == "EVICTED" and states["m1/1"] == "READY" == states["m2/1"]
    assert metric(server.url, "serval_resident_bytes") <= 6_000_000
    assert call(server.url, "POST", "/v2/models/m0/infer", doc).status == 200  # reloads
    assert _states(server)["m1/1"] == "EVICTED"  # now the least recently used
    assert metric(server.url, "serval_model_evictions_total") == 2


def test_a_busy_model_is_never_evicted(server_factory: Factory, tmp_path: Path) -> None:
    fixture_models.slow(tmp_path)
    fixture_models.heavy(tmp_path, name="other", layers=2, width=512)
    server = server_factory(tmp_path, "--model-control", "lazy", "--memory-budget", "6MB")
    big = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [128, 1024],
                                    "data": [0.01] * (128 * 1024)}]})
    busy = threading.Thread(target=lambda: call(server.url, "POST", "/v2/models/slow/infer",
                                                big))
    busy.start()
    wait_until_running(server.url, "slow")
    doc = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 512],
                                    "data": [0.1] * 512}]})
    refused = call(server.url, "POST", "/v2/models/other/infer", doc)
    assert refused.status == 503 and "every loaded model is busy" in refused.error
    assert _states(server)["slow/1"] == "READY"
    busy.join(timeout=30)
    assert call(server.url, "POST", "/v2/models/other/infer", doc).status == 200
    assert _states(server)["slow/1"] == "EVICTED"


def test_hot_swap_under_load_fails_no_request(server_factory: Factory, tmp_path: Path) -> None:
    _linear_versions(tmp_path, "clf", [1], "max_batch_size: 8\n")
    server = server_factory(tmp_path, "--repository-api")
    seen: list[tuple[int, str]] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            reply = infer(server.url, "clf", X)
            seen.append((reply.status, reply.json().get("model_version", "")))

    workers = [threading.Thread(target=traffic) for _ in range(4)]
    for worker in workers:
        worker.start()
    for version in (2, 3):
        time.sleep(0.2)
        _linear_versions(tmp_path, "clf", [version], "max_batch_size: 8\n")
        assert call(server.url, "POST", "/v2/repository/models/clf/load").status == 200
    time.sleep(0.2)
    stop.set()
    for worker in workers:
        worker.join(timeout=30)
    assert seen and all(status == 200 for status, _ in seen)
    versions = [int(version) for _, version in seen]
    assert versions[-1] == 3 and {1, 3} <= set(versions)
    assert _states(server) == {"clf/1": "UNAVAILABLE", "clf/2": "UNAVAILABLE", "clf/3": "READY"}


def test_a_failing_new_version_leaves_the_old_one_serving(server_factory: Factory,
                                                          tmp_path: Path) -> None:
    _linear_versions(tmp_path, "clf", [1], "max_batch_size: 8\n")
    server = server_factory(tmp_path, "--repository-api")
    broken = tmp_path / "clf" / "2"
    broken.mkdir()
    (broken / "model.onnx").write_bytes(b"not a model")
    reply = call(server.url, "POST", "/v2/repository/models/clf/load")
    assert reply.status == 400 and "load failed" in reply.error  # as Triton: retrying won't do
    assert infer(server.url, "clf", X).json()["model_version"] == "1"
    index = call(server.url, "POST", "/v2/repository/index").json()
    failed = next(e for e in index if e["version"] == "2")
    assert failed["state"] == "UNAVAILABLE" and "load failed" in failed["reason"]
    assert np.isfinite(infer(server.url, "clf", X).json()["outputs"][0]["data"]).all()


def test_a_load_of_a_changed_model_reloads_it_and_of_an_unchanged_one_does_nothing(
        server_factory: Factory, tmp_path: Path) -> None:
    """Triton's load_model: the files of a served version replaced in place (new weights, an
    edited config) load again beside it, and the answers change with no failed request."""
    _linear_versions(tmp_path, "clf", [1], "max_batch_size: 8\n")
    server = server_factory(tmp_path, "--model-control", "explicit", "--load-model", "clf")
    client = triton.InferenceServerClient(server.url)
    before = infer(server.url, "clf", X).json()["outputs"][0]["data"]
    loads = metric(server.url, "serval_model_loads_total")
    client.load_model("clf")  # nothing changed: nothing loads
    assert metric(server.url, "serval_model_loads_total") == loads
    replacement = fixture_models.linear(tmp_path / "build", name="clf", seed=7)
    shutil.copyfile(replacement, tmp_path / "clf" / "1" / "model.onnx")
    (tmp_path / "clf" / "config.yaml").write_text("max_batch_size: 4\n")
    client.load_model("clf")
    assert metric(server.url, "serval_model_loads_total") == loads + 1
    assert client.get_model_config("clf")["max_batch_size"] == 4
    after = infer(server.url, "clf", X).json()
    assert after["model_version"] == "1" and after["outputs"][0]["data"] != before
    assert _states(server) == {"clf/1": "READY"}


def test_polling_reloads_a_model_whose_config_was_edited(server_factory: Factory,
                                                         tmp_path: Path) -> None:
    _linear_versions(tmp_path, "clf", [1], "max_batch_size: 8\n")
    server = server_factory(tmp_path, "--poll-interval-s", "0.1")
    client = triton.InferenceServerClient(server.url)
    assert client.get_model_config("clf")["max_batch_size"] == 8
    (tmp_path / "clf" / "config.yaml").write_text("max_batch_size: 2\n")
    deadline = time.monotonic() + 30
    while client.get_model_config("clf")["max_batch_size"] != 2:
        assert time.monotonic() < deadline, "the edited config did not load in 30 s"
        time.sleep(0.05)
    assert infer(server.url, "clf", X).status == 200


def test_polling_reloads_weights_rewritten_in_place(server_factory: Factory,
                                                    tmp_path: Path) -> None:
    """As Triton's poll: `cp new.onnx repo/clf/1/model.onnx` (no folder's time changes)
    reloads the model, and the answers change."""
    _linear_versions(tmp_path, "clf", [1], "max_batch_size: 8\n")
    server = server_factory(tmp_path, "--poll-interval-s", "0.1")
    before = infer(server.url, "clf", X).json()["outputs"][0]["data"]
    replacement = fixture_models.linear(tmp_path / "_build", name="clf", seed=7)  # not a model
    target = tmp_path / "clf" / "1" / "model.onnx"
    with open(target, "r+b") as out:  # rewritten through the same inode, as cp does
        out.write(replacement.read_bytes())
        out.truncate()
    deadline = time.monotonic() + 30
    while infer(server.url, "clf", X).json()["outputs"][0]["data"] == before:
        assert time.monotonic() < deadline, "the rewritten weights did not load in 30 s"
        time.sleep(0.05)
    assert _states(server) == {"clf/1": "READY"}
