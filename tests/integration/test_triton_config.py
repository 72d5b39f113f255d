"""A repository written as a Triton user writes it (config.pbtxt + 1/model.onnx), served and
asked with tritonclient over HTTP and gRPC: limits, version policy, warm-up, ensembles, the
config's JSON form, and load errors naming the field."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from serval.ports import free_ports
from tests import fixture_models, triton_sequence_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call

pytestmark = pytest.mark.integration

SIMPLE = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 100
                   priority_levels: 2 default_priority_level: 2
                   priority_queue_policy { key: 1 value: {
                     timeout_action: DELAY default_timeout_microseconds: 1
                     allow_timeout_override: false } } }
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { latest: { num_versions: 1 } }
parameters { key: "origin" value: { string_value: "triton" } }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "enable_mem_pattern" value: { string_value: "0" } }
optimization { graph { level: 1 } input_pinned_memory { enable: false } }
"""
ENSEMBLE = """
name: "sum_doubled"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [ { name: "DOUBLED" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling {
  step [
    { model_name: "simple" model_version: -1
      input_map { key: "INPUT0" value: "A" }
      input_map { key: "INPUT1" value: "B" }
      output_map { key: "OUTPUT0" value: "sum" } },
    { model_name: "double" model_version: -1
      input_map { key: "X" value: "sum" }
      output_map { key: "Y" value: "DOUBLED" } }
  ]
}
"""
NO_WARMUP = 'backend: "onnxruntime"\nmax_batch_size: 8\n'
WITH_WARMUP = NO_WARMUP + """model_warmup [ { name: "empty strings" batch_size: 1
  inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } } } ]
"""
FROM_FILE = """
max_batch_size: 8
model_warmup [ { name: "from files" batch_size: 4
  inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "in0" } }
  inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] input_data_file: "in1" } }
} ]
"""
RESHAPED = """
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4, 4 ] reshape: { shape: [ 16 ] } },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4, 4 ] reshape: { shape: [ 16 ] } }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4, 4 ] reshape: { shape: [ 16 ] } } ]
"""
BROKEN = {
    "unknown_field": ('max_batch_size: 8\nfoo: 1\n', "no field named \"foo\""),
    "unsupported_field": ('max_batch_size: 8\nsequence_batching { iterative_sequence: true }\n',
                          "field 'sequence_batching.iterative_sequence' is not supported"),
    "priority_levels": ('max_batch_size: 8\ndynamic_batching { priority_levels: 2 }\n',
                        "field 'dynamic_batching.default_priority_level' must be within 1..2"),
    "openvino_accelerator": (
        'max_batch_size: 8\noptimization { execution_accelerators { cpu_execution_accelerator '
        '[ { name: "openvino" } ] } }\n',
        "execution providers ['OpenVINOExecutionProvider'] are not available"),
    "wrong_datatype": ('max_batch_size: 8\ninput [ { name: "INPUT0" data_type: TYPE_INT32 '
                       'dims: [ 16 ] } ]\n', "data_type INT32 in the config, the model has FP32"),
    "checksum_mismatch": (
        'max_batch_size: 8\nmodel_repository_agents { agents [ { name: "checksum" parameters '
        '{ key: "MD5:1/model.onnx" value: "00000000000000000000000000000000" } } ] }\n',
        "the checksum agent refuses the load: 1/model.onnx: MD5 is "),
    "other_agent": ('max_batch_size: 8\nmodel_repository_agents { agents [ { name: "relocation" '
                    '} ] }\n', "agent 'relocation' is not available in Serval"),
}
CHECKSUM = ('max_batch_size: 8\nmodel_repository_agents {{ agents [ {{ name: "checksum" '
            'parameters {{ key: "MD5:1/model.onnx" value: "{}" }} }} ] }}\n')


def _ensemble(root: Path) -> None:
    """`sum_doubled`, Triton's ensemble config, over its two step models `simple` and
    `double`."""
    fixture_models.add_sub(root, "simple")
    fixture_models.triton_config(root, "simple", SIMPLE)
    fixture_models.double(root)
    fixture_models.triton_config(root, "double", "max_batch_size: 8\n")
    (root / "sum_doubled" / "1").mkdir(parents=True)
    fixture_models.triton_config(root, "sum_doubled", ENSEMBLE)


@pytest.fixture(scope="module")
def triton_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("triton-repository")
    _ensemble(root)
    for version in ("1", "2", "3"):
        fixture_models.add_sub(root, "versioned", config="", version=version)
    fixture_models.triton_config(root, "versioned", "max_batch_size: 8\n"
                                 "version_policy: { specific: { versions: [ 1, 3 ] } }\n")
    fixture_models.parse_int(root)
    fixture_models.triton_config(root, "parse_int", NO_WARMUP)
    fixture_models.add_sub(root, "reshaped")
    fixture_models.triton_config(root, "reshaped", RESHAPED)
    _warm_from_files(root, "warm_from_file", 16 * 4)
    return root


def _warm_from_files(root: Path, name: str, size: int) -> None:
    """An add_sub model warmed up from raw data files of `size` bytes each."""
    fixture_models.add_sub(root, name)
    fixture_models.triton_config(root, name, FROM_FILE)
    (root / name / "warmup").mkdir()
    for index in (0, 1):
        (root / name / "warmup" / f"in{index}").write_bytes(
            np.full(size // 4, index + 1, np.float32).tobytes())


@pytest.fixture(scope="module")
def triton_server(server_factory: Callable[..., RunningServer],
                  triton_repository: Path) -> RunningServer:
    return server_factory(triton_repository)


def _clients(server: RunningServer) -> list[object]:
    return [httpclient.InferenceServerClient(server.url),
            grpcclient.InferenceServerClient(server.grpc_url)]


def _inputs(module: object, rows: int) -> tuple[list[object], np.ndarray, np.ndarray]:
    a = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
    b = np.ones((rows, 16), dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [rows, 16], "FP32"),  # type: ignore[attr-defined]
              module.InferInput("INPUT1", [rows, 16], "FP32")]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_max_batch_size_is_served_and_enforced(triton_server: RunningServer,
                                               transport: str) -> None:
    module = httpclient if transport == "http" else grpcclient
    client = _clients(triton_server)[transport == "grpc"]
    config = client.get_model_config("simple")  # type: ignore[attr-defined]
    config = config if transport == "http" else json_format.MessageToDict(
        config.config, preserving_proto_field_name=True)
    assert config["max_batch_size"] == 8
    metadata = client.get_model_metadata("simple")  # type: ignore[attr-defined]
    shape = metadata["inputs"][0]["shape"] if transport == "http" else metadata.inputs[0].shape
    assert [int(d) for d in shape] == [-1, 16]
    inputs, a, b = _inputs(module, 8)
    result = client.infer("simple", inputs)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    for priority in (1, 7):  # a priority level, and one out of range (the default level)
        result = client.infer("simple", inputs, priority=priority)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    inputs, _, _ = _inputs(module, 9)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("simple", inputs)  # type: ignore[attr-defined]
    assert "batch size 9" in str(refused.value) and "1 to 8" in str(refused.value)
    status = refused.value.status()
    assert status in ("400", "StatusCode.INVALID_ARGUMENT")


def test_get_model_config_is_the_pbtxt_in_tritons_json_form(
        triton_server: RunningServer) -> None:
    parsed = text_format.Parse(SIMPLE, model_config_pb2.ModelConfig())
    parsed.backend = "onnxruntime"  # Triton fills the backend of a platform it knows
    http_config = httpclient.InferenceServerClient(triton_server.url).get_model_config("simple")
    assert http_config["input"][0]["dims"] == [16]  # numbers, as Triton writes them
    assert json_format.ParseDict(http_config, model_config_pb2.ModelConfig()) == parsed
    grpc_config = grpcclient.InferenceServerClient(triton_server.grpc_url).get_model_config(
        "simple").config
    assert grpc_config == parsed
    assert grpc_config.instance_group[0].count == 2
    assert grpc_config.parameters["origin"].string_value == "triton"


def test_version_policy_is_honoured(triton_server: RunningServer) -> None:
    for client in _clients(triton_server):
        assert client.is_model_ready("versioned", "1")  # type: ignore[attr-defined]
        assert client.is_model_ready("versioned", "3")  # type: ignore[attr-defined]
    http = httpclient.InferenceServerClient(triton_server.url)
    with pytest.raises(InferenceServerException):
        http.infer("versioned", _inputs(httpclient, 1)[0], model_version="2")
    result = http.infer("versioned", _inputs(httpclient, 1)[0])
    assert result.get_response()["model_version"] == "3"


def test_a_model_that_failed_the_forced_warm_up_loads(triton_server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(triton_server.url)
    assert client.is_model_ready("parse_int")
    text = httpclient.InferInput("TEXT", [2, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"12"], [b"-7"]], dtype=object))
    result = client.infer("parse_int", [text])
    np.testing.assert_array_equal(result.as_numpy("NUMBER"), [[12], [-7]])


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_an_ensemble_runs_its_steps_on_the_pipeline_engine(triton_server: RunningServer,
                                                           transport: str) -> None:
    module = httpclient if transport == "http" else grpcclient
    client = _clients(triton_server)[transport == "grpc"]
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 3.0, dtype=np.float32)
    inputs = [module.InferInput("A", [2, 16], "FP32"),  # type: ignore[attr-defined]
              module.InferInput("B", [2, 16], "FP32")]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("sum_doubled", inputs)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(result.as_numpy("DOUBLED"), (a + b) * 2)


@pytest.fixture(scope="module")
def explicit_server(server_factory: Callable[..., RunningServer],
                    tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("triton-broken")
    for name, (pbtxt, _) in BROKEN.items():
        fixture_models.add_sub(root, name)
        fixture_models.triton_config(root, name, pbtxt)
    fixture_models.parse_int(root, "warm_up_fails")
    fixture_models.triton_config(root, "warm_up_fails", WITH_WARMUP)
    _warm_from_files(root, "warm_file_short", 15 * 4)
    fixture_models.add_sub(root, "checksum_match")
    digest = hashlib.md5((root / "checksum_match" / "1" / "model.onnx").read_bytes(),
                         usedforsecurity=False).hexdigest()
    fixture_models.triton_config(root, "checksum_match", CHECKSUM.format(digest))
    triton_sequence_models.build_one(root, "accumulate_from_file")
    (root / "accumulate_from_file" / "initial_state" / "start.bin").write_bytes(b"\0" * 3)
    return server_factory(root, "--model-control", "explicit")


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_config_serval_cannot_honour_is_a_load_error_naming_the_field(
        explicit_server: RunningServer, name: str) -> None:
    expected = BROKEN[name][1]
    for client in _clients(explicit_server):
        with pytest.raises(InferenceServerException) as failed:
            client.load_model(name)  # type: ignore[attr-defined]
        assert expected in str(failed.value)
    index = httpclient.InferenceServerClient(explicit_server.url).get_model_repository_index()
    entry = next(e for e in index if e["name"] == name)
    assert entry["state"] == "UNAVAILABLE" and expected in entry["reason"]


def test_a_configured_warm_up_runs_and_its_failure_refuses_the_load(
        explicit_server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(explicit_server.url)
    with pytest.raises(InferenceServerException) as failed:
        client.load_model("warm_up_fails")
    assert "model_warmup 'empty strings' failed" in str(failed.value)


def test_a_warm_up_from_data_files_runs_and_a_short_file_refuses_the_load(
        triton_server: RunningServer, explicit_server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(triton_server.url)
    assert client.is_model_ready("warm_from_file")
    statistics = client.get_inference_statistics("warm_from_file")["model_stats"][0]
    assert statistics["inference_count"] == 0  # warm-up runs are not counted, as Triton
    with pytest.raises(InferenceServerException) as failed:
        httpclient.InferenceServerClient(explicit_server.url).load_model("warm_file_short")
    assert ("model_warmup 'from files' input 'INPUT0': input_data_file 'in0': FP32 shape "
            "[16] needs 64 bytes, it has 60") in str(failed.value)  # inputs in name order


def test_a_model_whose_files_match_its_checksum_agent_loads(
        explicit_server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    client.load_model("checksum_match")
    assert client.is_model_ready("checksum_match")
    inputs, a, b = _inputs(grpcclient, 2)
    result = client.infer("checksum_match", inputs)  # type: ignore[arg-type]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_a_short_initial_state_file_refuses_the_load(explicit_server: RunningServer) -> None:
    for client in _clients(explicit_server):
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("accumulate_from_file")  # type: ignore[attr-defined]
        assert ("state 'STATE_IN': initial_state data_file 'start.bin': FP32 shape [1] needs "
                "4 bytes, it has 3") in str(failed.value)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_requests_past_a_delay_timeout_are_answered_not_refused(
        triton_server: RunningServer, transport: str) -> None:
    """Priority 1 of `simple` times out after 1 µs with timeout_action DELAY: every request
    is past it before a batch takes it, and each is answered (REJECT would refuse them)."""
    module = httpclient if transport == "http" else grpcclient

    def client_run(seed: int) -> None:
        client = (httpclient.InferenceServerClient(triton_server.url) if transport == "http"
                  else grpcclient.InferenceServerClient(triton_server.grpc_url))
        for _ in range(10):
            inputs, a, b = _inputs(module, 1 + seed % 3)
            result = client.infer("simple", inputs, priority=1)  # type: ignore[attr-defined]
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(client_run, range(6)))


def test_declared_dims_are_served_and_reshaped_for_the_engine(
        triton_server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    metadata = client.get_model_metadata("reshaped")
    assert [list(t.shape) for t in metadata.inputs] == [[-1, 4, 4], [-1, 4, 4]]
    assert [(t.name, list(t.shape)) for t in metadata.outputs] == [("OUTPUT0", [-1, 4, 4]),
                                                                    ("OUTPUT1", [-1, 16])]
    a = np.arange(32, dtype=np.float32).reshape(2, 4, 4)
    inputs = [grpcclient.InferInput("INPUT0", [2, 4, 4], "FP32"),
              grpcclient.InferInput("INPUT1", [2, 4, 4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer("reshaped", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)


@pytest.fixture(scope="module")
def ensemble_server(server_factory: Callable[..., RunningServer],
                    tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("ensemble")
    _ensemble(root)
    return server_factory(root, "--model-control", "explicit")


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_unload_dependents_takes_an_ensembles_steps_too(ensemble_server: RunningServer,
                                                        transport: str) -> None:
    client: Any = (httpclient.InferenceServerClient(ensemble_server.url) if transport == "http"
                   else grpcclient.InferenceServerClient(ensemble_server.grpc_url))
    models = ("sum_doubled", "simple", "double")
    client.load_model("sum_doubled")  # its steps load with it
    assert all(client.is_model_ready(name) for name in models)
    client.unload_model("sum_doubled")  # Triton's default: the steps stay
    assert [client.is_model_ready(name) for name in models] == [False, True, True]
    client.load_model("sum_doubled")
    client.unload_model("sum_doubled", unload_dependents=True)
    assert not any(client.is_model_ready(name) for name in models)
    if transport == "http":
        odd = call(ensemble_server.url, "POST", "/v2/repository/models/simple/unload",
                   b'{"parameters": {"unload_dependents": "yes"}}')
        assert odd.status == 400 and "'unload_dependents' must be a JSON boolean" in odd.error
    assert "model_repository(unload_dependents)" in (
        httpclient.InferenceServerClient(ensemble_server.url).get_server_metadata()["extensions"])


def test_load_model_at_start_under_explicit_control(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    fixture_models.add_sub(tmp_path, "simple")
    fixture_models.triton_config(tmp_path, "simple", SIMPLE)
    fixture_models.double(tmp_path)
    fixture_models.corrupt(tmp_path)
    server = server_factory(tmp_path, "--model-control", "explicit", "--load-model", "simple",
                            "--load-model", "corrupt")
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_model_ready("simple") and not client.is_model_ready("double")
    assert not client.is_server_ready()  # asked for at start, corrupt does not serve
    client.unload_model("corrupt")
    assert client.is_server_ready()
    everything = server_factory(tmp_path, "--model-control", "explicit", "--load-model", "*")
    client = httpclient.InferenceServerClient(everything.url)
    assert client.is_model_ready("simple") and client.is_model_ready("double")


def test_tritons_flag_names_serve_a_repository_and_poll_it(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    """`--model-repository`, `--model-control-mode poll` and `--repository-poll-secs` as a
    tritonserver command line has them."""
    repository = tmp_path / "models"
    fixture_models.add_sub(repository, "simple")
    fixture_models.triton_config(repository, "simple", SIMPLE)
    server = server_factory(None, "--model-repository", str(repository),
                            "--model-control-mode", "poll", "--repository-poll-secs", "0.1")
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_model_ready("simple")
    fixture_models.double(repository)  # a model appears: the poll loads it
    deadline = time.monotonic() + 30
    while not client.is_model_ready("double"):
        assert time.monotonic() < deadline, "the new model did not load in 30 s"
        time.sleep(0.05)


def test_a_tritonserver_deployment_command_line_serves_unchanged(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    """The flags a Kubernetes manifest for Triton carries, in Triton's `--flag=value` form:
    those with a meaning here are applied, the others are named on stderr as ignored."""
    repository = tmp_path / "models"
    fixture_models.add_sub(repository, "simple")
    fixture_models.triton_config(repository, "simple", SIMPLE)
    (metrics_port,) = free_ports(1)
    server = server_factory(
        None, f"--model-repository={repository}", "--strict-model-config=false",
        "--log-verbose=1", "--allow-gpu-metrics=false", "--exit-on-error=false",
        f"--metrics-port={metrics_port}", "--pinned-memory-pool-byte-size=268435456",
        "--cuda-memory-pool-byte-size=0:67108864", "--backend-config=python,shm-growth=1",
        "--strict-readiness=false", "--model-control-mode=explicit", "--load-model=simple",
        "--http-address=127.0.0.1")
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_model_ready("simple")
    assert call(f"127.0.0.1:{metrics_port}", "GET", "/metrics").status == 200
    log = server.log()
    for flag in ("--strict-model-config", "--allow-gpu-metrics", "--exit-on-error",
                 "--pinned-memory-pool-byte-size", "--cuda-memory-pool-byte-size",
                 "--backend-config"):
        assert f"serval: ignoring {flag} (" in log, flag
    assert client.get_log_settings()["log_verbose_level"] == 1  # --log-verbose=1

