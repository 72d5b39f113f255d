"""Triton's response cache on a real server (`--cache-config local,size=...`, config.pbtxt's
`response_cache { enable: true }`), asked with tritonclient over HTTP and gRPC: a repeated
request is answered without running the model, statistics and metrics count it, a reload
forgets what the old load answered, and a model or server without the cache never caches."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests import fixture_models, triton_python_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call
from tests.integration.test_triton_config import ENSEMBLE, SIMPLE
from tests.triton_bls_models import BLS_SYNC

pytestmark = pytest.mark.integration

CACHED = "response_cache { enable: true }\n"
_SEEDS = itertools.count(1)


def _repository(root: Path) -> Path:
    """`simple` (cached), `plain` (the same model, not cached), the ensemble `sum_doubled`
    over `simple` and `double` (cached at the top), and the Python model `bls_cached`
    (cached) that runs the model its MODEL_NAME input names, here the Python `callee`."""
    fixture_models.add_sub(root, "simple")
    fixture_models.triton_config(root, "simple", SIMPLE + CACHED)
    fixture_models.add_sub(root, "plain")
    fixture_models.triton_config(root, "plain", SIMPLE.replace('"simple"', '"plain"'))
    fixture_models.double(root)
    fixture_models.triton_config(root, "double", "max_batch_size: 8\n")
    (root / "sum_doubled" / "1").mkdir(parents=True)
    fixture_models.triton_config(root, "sum_doubled", ENSEMBLE + CACHED)
    triton_python_models.write_pbtxt(root, "callee", triton_python_models.ADD_SUB,
                                     triton_python_models.ADD_SUB_PBTXT)
    cached = CACHED.replace("{", "{{").replace("}", "}}")  # write_pbtxt formats the text
    triton_python_models.write_pbtxt(root, "bls_cached", BLS_SYNC, BLS_CACHED_PBTXT + cached)
    return root


BLS_CACHED_PBTXT = triton_python_models.ADD_SUB_PBTXT.replace(  # and which model to run
    "}}\n]\noutput",
    '}},\n  {{ name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] }}\n]\noutput')


@pytest.fixture(scope="module")
def cached_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("cached-repository"))


@pytest.fixture(scope="module")
def cache_server(server_factory: Callable[..., RunningServer],
                 cached_repository: Path) -> RunningServer:
    return server_factory(cached_repository, "--cache-config", "local,size=1048576",
                          "--model-control", "explicit", "--load-model", "*",
                          "--allow-python-models")


def _triple_as_version_2(root: Path) -> None:
    """`double`'s version 2 multiplies by 3."""
    model = onnx.load(str(root / "double" / "1" / "model.onnx"))
    [factor] = model.graph.initializer
    factor.CopyFrom(onnx.numpy_helper.from_array(np.array(3.0, np.float32), factor.name))
    (root / "double" / "2").mkdir()
    onnx.save(model, str(root / "double" / "2" / "model.onnx"))


def _client(server: RunningServer, transport: str) -> Any:
    if transport == "http":
        return httpclient.InferenceServerClient(server.url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _infer(client: Any, model: str, a: np.ndarray, b: np.ndarray,
           names: tuple[str, str] = ("INPUT0", "INPUT1"), **kwargs: Any) -> Any:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    inputs = [module.InferInput(names[0], list(a.shape), "FP32"),
              module.InferInput(names[1], list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return client.infer(model, inputs, **kwargs)


def _fresh_pair() -> tuple[np.ndarray, np.ndarray]:
    """Inputs no other test sends (so each test sees its own hits and misses)."""
    seed = next(_SEEDS)
    return (np.full((1, 16), seed * 100.0, np.float32),  # a + 1 in a test stays its own
            np.arange(16, dtype=np.float32).reshape(1, 16))


def _counts(server: RunningServer, model: str) -> tuple[int, int, int]:
    """(cache hits, cache misses, engine executions) from Triton's statistics."""
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics(model)
    [entry] = stats["model_stats"]
    inference = entry["inference_stats"]
    return (inference["cache_hit"]["count"], inference["cache_miss"]["count"],
            entry["execution_count"])


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_repeated_request_is_answered_without_running_the_model(
        cache_server: RunningServer, transport: str) -> None:
    client = _client(cache_server, transport)
    a, b = _fresh_pair()
    hits, misses, executions = _counts(cache_server, "simple")
    first = _infer(client, "simple", a, b)
    again = _infer(client, "simple", a, b)
    np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(again.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(again.as_numpy("OUTPUT1"), a - b)
    assert _counts(cache_server, "simple") == (hits + 1, misses + 1, executions + 1)
    other = _infer(client, "simple", a + 1, b)  # another input: the model runs
    np.testing.assert_array_equal(other.as_numpy("OUTPUT0"), a + 1 + b)
    assert _counts(cache_server, "simple") == (hits + 1, misses + 2, executions + 2)


def test_a_hit_answers_only_the_outputs_asked_for(cache_server: RunningServer) -> None:
    client = _client(cache_server, "http")
    a, b = _fresh_pair()
    _infer(client, "simple", a, b)
    asked = [httpclient.InferRequestedOutput("OUTPUT1")]
    result = _infer(client, "simple", a, b, outputs=asked)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_request_parameters_are_part_of_the_key_but_timeouts_are_not(
        cache_server: RunningServer) -> None:
    client = _client(cache_server, "grpc")
    a, b = _fresh_pair()
    hits, misses, _ = _counts(cache_server, "simple")
    _infer(client, "simple", a, b, parameters={"flavour": "salt"})
    _infer(client, "simple", a, b, parameters={"flavour": "pepper"})
    assert _counts(cache_server, "simple")[:2] == (hits, misses + 2)
    _infer(client, "simple", a, b, parameters={"flavour": "salt"}, timeout=5_000_000)
    assert _counts(cache_server, "simple")[:2] == (hits + 1, misses + 2)


def test_a_model_without_response_cache_always_runs(cache_server: RunningServer) -> None:
    client = _client(cache_server, "http")
    a, b = _fresh_pair()
    _, _, executions = _counts(cache_server, "plain")
    for _ in range(2):
        _infer(client, "plain", a, b)
    assert _counts(cache_server, "plain") == (0, 0, executions + 2)


def test_an_ensemble_is_cached_until_a_step_model_changes(cache_server: RunningServer,
                                                          cached_repository: Path) -> None:
    client = _client(cache_server, "http")
    a, b = _fresh_pair()
    hits, misses, _ = _counts(cache_server, "sum_doubled")
    for _ in range(2):
        result = _infer(client, "sum_doubled", a, b, names=("A", "B"))
        np.testing.assert_array_equal(result.as_numpy("DOUBLED"), (a + b) * 2)
    assert _counts(cache_server, "sum_doubled")[:2] == (hits + 1, misses + 1)
    _triple_as_version_2(cached_repository)
    client.load_model("double")  # version 2 serves, version 1 retires
    result = _infer(client, "sum_doubled", a, b, names=("A", "B"))
    np.testing.assert_array_equal(result.as_numpy("DOUBLED"), (a + b) * 3)
    assert _counts(cache_server, "sum_doubled")[:2] == (hits + 1, misses + 2)


def test_a_model_calling_others_is_cached_until_one_it_calls_changes(
        cache_server: RunningServer, cached_repository: Path) -> None:
    """A BLS model is a composite the server learns of at its first call: its entries go
    when a model it runs is replaced (the old code answered the old callee's result)."""
    client = httpclient.InferenceServerClient(cache_server.url)
    a, b = _fresh_pair()

    def ask() -> np.ndarray:
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32"),
                  httpclient.InferInput("INPUT1", [1, 16], "FP32"),
                  httpclient.InferInput("MODEL_NAME", [1, 1], "BYTES")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        inputs[2].set_data_from_numpy(np.array([[b"callee"]], np.object_))
        return client.infer("bls_cached", inputs).as_numpy("OUTPUT0")

    def answered_from_cache(expected: np.ndarray) -> bool:
        hits, misses, _ = _counts(cache_server, "bls_cached")
        np.testing.assert_array_equal(ask(), expected)
        after = _counts(cache_server, "bls_cached")[:2]
        assert after in ((hits + 1, misses), (hits, misses + 1))
        return after[0] == hits + 1

    for _ in range(2):  # at its first call, the server learns it calls others
        np.testing.assert_array_equal(ask(), a + b)
    assert answered_from_cache(a + b)
    (cached_repository / "callee" / "2").mkdir()
    (cached_repository / "callee" / "2" / "model.py").write_text(
        triton_python_models.ADD_SUB.replace("(in0 + in1)", "(in0 + in1 + 1)"))
    client.load_model("callee")  # version 2 serves, version 1 retires
    np.testing.assert_array_equal(ask(), a + b + 1)  # the old code: a + b, from the cache
    assert answered_from_cache(a + b + 1)


def test_a_reloaded_model_does_not_answer_from_its_old_load(cache_server: RunningServer) -> None:
    client = _client(cache_server, "grpc")
    a, b = _fresh_pair()
    _infer(client, "simple", a, b)
    hits, misses, _ = _counts(cache_server, "simple")
    config = httpclient.InferenceServerClient(cache_server.url).get_model_config("simple")
    client.load_model("simple", config=json.dumps(config))  # loads afresh beside the old one
    _infer(client, "simple", a, b)
    _infer(client, "simple", a, b)
    assert _counts(cache_server, "simple")[:2] == (hits + 1, misses + 1)


def test_metrics_show_hits_misses_and_the_bytes_held(cache_server: RunningServer) -> None:
    client = _client(cache_server, "http")
    a, b = _fresh_pair()
    for _ in range(2):
        _infer(client, "simple", a, b)
    metrics = call(cache_server.url, "GET", "/metrics").body.decode()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
              for line in metrics.splitlines() if line.startswith("serval_response_cache")}
    assert values['serval_response_cache_hits_total{model="simple",version="1"}'] >= 1
    assert values['serval_response_cache_misses_total{model="simple",version="1"}'] >= 1
    assert values["serval_response_cache_capacity_bytes"] == 1048576
    assert 0 < values["serval_response_cache_bytes"] <= 1048576
    assert values["serval_response_cache_entries"] >= 1
    assert not any('model="plain"' in name for name in values)


def test_without_a_server_cache_a_model_that_enables_it_is_not_cached(
        server_factory: Callable[..., RunningServer],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("uncached-server")
    fixture_models.add_sub(root, "simple")
    fixture_models.triton_config(root, "simple", SIMPLE + CACHED)
    server = server_factory(root)
    client = _client(server, "http")
    a, b = _fresh_pair()
    for _ in range(2):
        _infer(client, "simple", a, b)
    assert _counts(server, "simple") == (0, 0, 2)
    assert "no cache (--cache-config local,size=BYTES)" in server.log()
