"""Triton's logging and trace extensions over gRPC: stock tritonclient.grpc's get/update
log and trace settings against a real server, and the traces it writes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests import fixture_models
from tests.conftest import RunningServer

pytestmark = pytest.mark.integration

MODEL = "linear"
LOG_DEFAULTS = {"log_file": "", "log_info": True, "log_warnings": True, "log_errors": True,
                "log_verbose_level": 0, "log_format": "default"}
TIMELINE = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"]


@pytest.fixture(scope="module")
def traced(server_factory: Callable[..., RunningServer],
           tmp_path_factory: pytest.TempPathFactory) -> tuple[RunningServer, Path]:
    """A server with a trace file, serving one small ONNX model."""
    root = tmp_path_factory.mktemp("settings")
    repository = root / "repository"
    fixture_models.linear(repository)
    trace_file = root / "traces" / "trace.json"
    trace_file.parent.mkdir()
    return server_factory(repository, "--trace-file", str(trace_file)), trace_file


@pytest.fixture()
def client(traced: tuple[RunningServer, Path]) -> Iterator[triton.InferenceServerClient]:
    """A client; whatever a test changed in the log and global trace settings is reset after
    it (they are the process's)."""
    client = triton.InferenceServerClient(traced[0].grpc_url)
    yield client
    client.update_log_settings({k: v for k, v in LOG_DEFAULTS.items() if k != "log_file"})
    client.update_trace_settings(settings={"trace_level": None, "trace_rate": None,
                                           "trace_count": None, "log_frequency": None})
    client.update_trace_settings(model_name=MODEL, settings={"trace_rate": None})
    client.close()


def _log(client: triton.InferenceServerClient, changes: dict[str, Any] | None = None
         ) -> dict[str, Any]:
    """The log settings as plain values, after `changes` if given."""
    answer = (client.get_log_settings(as_json=True) if changes is None
              else client.update_log_settings(changes, as_json=True))
    return {name: next(iter(value.values())) for name, value in answer["settings"].items()}


def _trace(client: triton.InferenceServerClient, model: str | None = None,
           changes: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """The trace settings as lists of strings, after `changes` if given."""
    answer = (client.get_trace_settings(model_name=model, as_json=True) if changes is None
              else client.update_trace_settings(model_name=model, settings=changes,
                                                as_json=True))
    return {name: value.get("value", []) for name, value in answer["settings"].items()}


def _infer(client: triton.InferenceServerClient, rows: int = 2) -> None:
    x = triton.InferInput("x", [rows, 8], "FP32")
    x.set_data_from_numpy(np.ones((rows, 8), dtype=np.float32))
    result = client.infer(MODEL, [x])
    assert result.as_numpy("probabilities").shape == (rows, 4)


def _refused(call: Callable[[], object], status: str, *words: str) -> None:
    with pytest.raises(InferenceServerException) as caught:
        call()
    assert caught.value.status() == f"StatusCode.{status}"
    for word in words:
        assert word in caught.value.message()


def test_the_extensions_are_announced(client: triton.InferenceServerClient) -> None:
    extensions = client.get_server_metadata(as_json=True)["extensions"]
    assert "logging" in extensions and "trace" in extensions


def test_log_settings_are_read_and_changed(client: triton.InferenceServerClient) -> None:
    assert _log(client) == LOG_DEFAULTS
    changed = _log(client, {"log_verbose_level": 1, "log_info": False})
    assert changed == {**LOG_DEFAULTS, "log_verbose_level": 1, "log_info": False}
    assert _log(client) == changed  # they stay changed
    assert _log(client, {"log_format": "ISO8601"})["log_format"] == "ISO8601"


def test_bad_log_settings_are_invalid_arguments(client: triton.InferenceServerClient) -> None:
    _refused(lambda: client.update_log_settings({"log_format": "xml"}), "INVALID_ARGUMENT",
             "log_format")
    _refused(lambda: client.update_log_settings({"log_file": "/tmp/elsewhere.log"}),
             "INVALID_ARGUMENT", "log_file")
    _refused(lambda: client.update_log_settings({"log_info": None}),  # an entry with no value
             "INVALID_ARGUMENT", "log_info", "no value")
    assert _log(client) == LOG_DEFAULTS  # nothing changed


def test_a_log_setting_of_the_wrong_type_is_an_invalid_argument(
        client: triton.InferenceServerClient, traced: tuple[RunningServer, Path]) -> None:
    """A string where a boolean belongs, as a hand-built request can send it (tritonclient
    cannot)."""
    request = service_pb2.LogSettingsRequest()
    request.settings["log_errors"].string_param = "yes"
    with (grpc.insecure_channel(traced[0].grpc_url) as channel,
          pytest.raises(grpc.RpcError) as caught):
        service_pb2_grpc.GRPCInferenceServiceStub(channel).LogSettings(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "log_errors" in str(caught.value.details())
    assert _log(client) == LOG_DEFAULTS


def test_global_trace_settings_default(client: triton.InferenceServerClient,
                                       traced: tuple[RunningServer, Path]) -> None:
    assert _trace(client) == {"trace_file": [str(traced[1])], "trace_level": ["OFF"],
                              "trace_rate": ["1000"], "trace_count": ["-1"],
                              "log_frequency": ["0"], "trace_mode": ["triton"]}


def test_sampled_requests_are_traced_to_the_file(client: triton.InferenceServerClient,
                                                 traced: tuple[RunningServer, Path]) -> None:
    trace_file = traced[1]
    before = set(trace_file.parent.iterdir())
    settings = _trace(client, changes={"trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                                       "log_frequency": "1"})
    assert settings["trace_level"] == ["TIMESTAMPS"] and settings["trace_rate"] == ["1"]
    for _ in range(3):
        _infer(client)
    traces = _written_traces(trace_file.parent, before, want=3)
    assert len(traces) >= 3
    for trace in traces:
        assert trace["model_name"] == MODEL and trace["model_version"] == 1
        named = {stamp["name"]: stamp["ns"] for stamp in trace["timestamps"]}
        assert set(TIMELINE) <= set(named), trace
        times = [named[name] for name in TIMELINE]
        assert times == sorted(times), trace
    _trace(client, changes={"trace_level": ["OFF"]})
    after_off = set(trace_file.parent.iterdir())
    _infer(client)
    assert set(trace_file.parent.iterdir()) == after_off  # OFF: nothing more is written


def test_model_trace_settings_override_the_global_ones(
        client: triton.InferenceServerClient) -> None:
    assert _trace(client, MODEL) == _trace(client)  # nothing of its own yet
    assert _trace(client, MODEL, {"trace_rate": "5"})["trace_rate"] == ["5"]
    assert _trace(client, MODEL)["trace_rate"] == ["5"]  # a read (empty map) clears nothing
    assert _trace(client)["trace_rate"] == ["1000"]  # the global one is unchanged
    cleared = _trace(client, MODEL, {"trace_rate": None})  # no value: back to the global one
    assert cleared["trace_rate"] == ["1000"]


def test_bad_trace_settings_are_refused(client: triton.InferenceServerClient) -> None:
    _refused(lambda: client.get_trace_settings(model_name="nope"), "NOT_FOUND", "nope")
    _refused(lambda: client.update_trace_settings(model_name="nope",
                                                  settings={"trace_rate": "5"}),
             "NOT_FOUND", "nope")
    _refused(lambda: client.update_trace_settings(settings={"trace_level": ["TENSORS"]}),
             "INVALID_ARGUMENT", "TENSORS")
    _refused(lambda: client.update_trace_settings(settings={"trace_rate": "often"}),
             "INVALID_ARGUMENT", "trace_rate")
    _refused(lambda: client.update_trace_settings(settings={"trace_file": "/tmp/other.json"}),
             "INVALID_ARGUMENT", "trace_file")
    assert _trace(client)["trace_level"] == ["OFF"]  # nothing changed


@pytest.fixture(scope="module")
def secured(server_factory: Callable[..., RunningServer],
            tmp_path_factory: pytest.TempPathFactory) -> tuple[RunningServer, dict[str, str]]:
    """A server with bearer tokens: one that may read, one that may infer, one admin."""
    root = tmp_path_factory.mktemp("secured-settings")
    fixture_models.linear(root / "repository")
    tokens_file = root / "tokens.yaml"
    tokens = {scope: _token(tokens_file, scope) for scope in ("read", "infer:linear", "admin")}
    server = server_factory(root / "repository", "--auth-tokens", str(tokens_file),
                            "--trace-file", str(root / "trace.json"))
    return server, tokens


def test_reading_settings_takes_read_changing_them_admin(
        secured: tuple[RunningServer, dict[str, str]]) -> None:
    server, tokens = secured
    client = triton.InferenceServerClient(server.grpc_url)
    as_reader = {"authorization": f"Bearer {tokens['read']}"}
    as_admin = {"authorization": f"Bearer {tokens['admin']}"}
    as_runner = {"authorization": f"Bearer {tokens['infer:linear']}"}
    _refused(lambda: client.get_log_settings(), "UNAUTHENTICATED")
    _refused(lambda: client.get_trace_settings(model_name=MODEL, headers=as_runner),
             "PERMISSION_DENIED")  # a server-wide read, as over HTTP
    assert client.get_log_settings(headers=as_reader, as_json=True)["settings"]
    assert client.get_trace_settings(model_name=MODEL, headers=as_reader, as_json=True)
    _refused(lambda: client.update_log_settings({"log_verbose_level": 1}, headers=as_reader),
             "PERMISSION_DENIED")
    _refused(lambda: client.update_trace_settings(settings={"trace_rate": "7"},
                                                  headers=as_reader), "PERMISSION_DENIED")
    changed = client.update_trace_settings(settings={"trace_rate": "7"}, headers=as_admin,
                                           as_json=True)
    assert changed["settings"]["trace_rate"]["value"] == ["7"]
    verbose = client.update_log_settings({"log_verbose_level": 0}, headers=as_admin,
                                         as_json=True)
    assert verbose["settings"]["log_verbose_level"] == {"uint32_param": 0}
    client.close()


def _token(tokens: Path, scope: str) -> str:
    result = subprocess.run([sys.executable, "-m", "serval", "token", "create", "--tokens-file",
                             str(tokens), "--name", scope.replace(":", "-"), "--scope", scope],
                            capture_output=True, text=True, timeout=60, check=True)
    return result.stdout.strip()


def _written_traces(folder: Path, before: set[Path], want: int, timeout_s: float = 10.0
                    ) -> list[dict[str, Any]]:
    """The traces in files that appeared in `folder`, once there are `want` of them."""
    deadline = time.monotonic() + timeout_s
    while True:
        traces: list[dict[str, Any]] = []
        for path in sorted(set(folder.iterdir()) - before):
            try:
                traces += json.loads(path.read_bytes())
            except ValueError:  # being written
                continue
        if len(traces) >= want or time.monotonic() > deadline:
            return traces
        time.sleep(0.05)  # polling, bounded by the deadline
