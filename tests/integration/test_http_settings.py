"""Triton's logging and trace extensions over HTTP, driven by tritonclient.http as Triton users
drive them: settings read and changed on a running server, traces written to its trace file,
and the server's log following its log settings."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.conftest import RunningServer

pytestmark = pytest.mark.integration

STAMPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
          "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]


@pytest.fixture(scope="module")
def traced(server_factory: Callable[..., RunningServer], fixture_repository: Path,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[RunningServer, Path]:
    trace_file = tmp_path_factory.mktemp("traces") / "trace.json"
    server = server_factory(fixture_repository, "--no-strict-readiness", "--repository-api",
                            "--trace-file", str(trace_file))
    return server, trace_file


@pytest.fixture
def client(traced: tuple[RunningServer, Path]) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(traced[0].url)


def _add_sub(client: triton.InferenceServerClient, times: int) -> None:
    a = np.ones((1, 16), np.float32)
    for _ in range(times):
        inputs = [triton.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
        for item in inputs:
            item.set_data_from_numpy(a)
        result = client.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def _wait_for(paths: Callable[[], list[Path]], count: int) -> list[Path]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = paths()
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{len(paths())} trace files, expected {count}")


def test_extensions_are_listed(client: triton.InferenceServerClient) -> None:
    extensions = client.get_server_metadata()["extensions"]
    assert {"logging", "trace", "classification", "sequence"} <= set(extensions)


def test_trace_settings_then_traces_in_the_file(client: triton.InferenceServerClient,
                                                traced: tuple[RunningServer, Path]) -> None:
    trace_file = traced[1]
    settings = client.get_trace_settings()
    assert settings == {"trace_file": str(trace_file), "trace_level": ["OFF"],
                        "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
                        "trace_mode": "triton"}
    _add_sub(client, 3)  # tracing is off: nothing is written
    assert not list(trace_file.parent.iterdir())
    # only add_sub, every request, a file per two traces
    client.update_trace_settings("add_sub", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                                             "log_frequency": "2"})
    assert client.get_trace_settings()["trace_level"] == ["OFF"]  # global unchanged
    assert client.get_trace_settings("add_sub")["trace_rate"] == "1"
    _add_sub(client, 4)
    files = _wait_for(lambda: sorted(trace_file.parent.glob("trace.json.*")), 2)
    traces = [t for f in files for t in orjson.loads(f.read_bytes())]
    assert [t["id"] for t in traces] == [1, 2, 3, 4]
    for trace in traces:
        assert (trace["model_name"], trace["model_version"]) == ("add_sub", 1)
        assert [s["name"] for s in trace["timestamps"]] == STAMPS
        times = [s["ns"] for s in trace["timestamps"]]
        assert times == sorted(times)
    # count: two more traces, then none; the count left reads back
    client.update_trace_settings("add_sub", {"trace_count": "2"})
    _add_sub(client, 5)
    assert client.get_trace_settings("add_sub")["trace_count"] == "0"
    _wait_for(lambda: sorted(trace_file.parent.glob("trace.json.*")), 3)
    # a model update with no settings clears the model's own: back to the global (off)
    assert client.update_trace_settings("add_sub", {}) == client.get_trace_settings()
    _add_sub(client, 3)
    assert len(list(trace_file.parent.glob("trace.json.*"))) == 3


@pytest.mark.parametrize(("settings", "named"), [
    ({"trace_level": ["TENSORS"]}, "TENSORS is not supported"),
    ({"trace_rate": "often"}, "'trace_rate' must be an integer >= 1"),
    ({"trace_file": "/tmp/elsewhere.json"}, "'trace_file' cannot be changed"),
    ({"trace_mode": "opentelemetry"}, "'trace_mode' must be 'triton'"),
])
def test_bad_trace_settings_are_refused_with_a_reason(
        client: triton.InferenceServerClient, settings: dict[str, Any], named: str) -> None:
    before = client.get_trace_settings()
    with pytest.raises(InferenceServerException, match=named) as caught:
        client.update_trace_settings(settings=settings)
    assert caught.value.status() == "400"
    assert client.get_trace_settings() == before


def test_an_unknown_models_trace_settings_are_404(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException, match="'nope' is not found") as caught:
        client.get_trace_settings("nope")
    assert caught.value.status() == "404"


def _loaded_lines(server: RunningServer) -> list[dict[str, Any]]:
    lines = [orjson.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    return [line for line in lines
            if line.get("msg") == "model loaded" and line.get("model") == "linear"]


def test_log_settings_change_what_the_server_logs(
        client: triton.InferenceServerClient, traced: tuple[RunningServer, Path]) -> None:
    server = traced[0]
    assert client.get_log_settings() == {"log_file": "", "log_info": True,
                                         "log_warnings": True, "log_errors": True,
                                         "log_verbose_level": 0, "log_format": "default"}
    before = len(_loaded_lines(server))  # loads are logged at INFO
    assert before >= 1
    try:
        changed = client.update_log_settings({"log_info": False})
        assert changed["log_info"] is False and client.get_log_settings() == changed
        client.unload_model("linear")
        client.load_model("linear")  # answered once loaded: its log line would be written
        assert len(_loaded_lines(server)) == before
        client.update_log_settings({"log_info": True, "log_format": "ISO8601"})
        client.unload_model("linear")
        client.load_model("linear")
        deadline = time.monotonic() + 10
        while len(_loaded_lines(server)) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        (line,) = _loaded_lines(server)[before:]
        assert len(line["ts"]) == len("2026-01-01T00:00:00Z")  # ISO8601: whole seconds
    finally:
        client.update_log_settings({"log_info": True, "log_format": "default"})


@pytest.mark.parametrize(("settings", "named"), [
    ({"log_verbose_level": -3}, "'log_verbose_level' must be an integer"),
    ({"log_info": "yes"}, "'log_info' must be a boolean"),
    ({"log_file": "/tmp/serval.log"}, "'log_file' cannot be changed"),
])
def test_bad_log_settings_are_refused_with_a_reason(
        client: triton.InferenceServerClient, settings: dict[str, Any], named: str) -> None:
    before = client.get_log_settings()
    with pytest.raises(InferenceServerException, match=named) as caught:
        client.update_log_settings(settings)
    assert caught.value.status() == "400"
    assert client.get_log_settings() == before


def test_trace_flags_at_start_and_the_rest_written_at_shutdown(
        server_factory: Callable[..., RunningServer], fixture_repository: Path,
        tmp_path: Path) -> None:
    trace_file = tmp_path / "start.json"
    server = server_factory(fixture_repository, "--no-strict-readiness",
                            "--trace-file", str(trace_file), "--trace-config", "level=TIMESTAMPS",
                            "--trace-config", "triton,rate=2", "--trace-config", "count=2")
    client = triton.InferenceServerClient(server.url)
    assert client.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]
    _add_sub(client, 6)  # every second request, two of them: then the count is spent
    assert not trace_file.exists()  # log_frequency 0: written at shutdown
    assert server.stop() == 0
    traces = orjson.loads(trace_file.read_bytes())
    assert [(t["id"], t["model_name"]) for t in traces] == [(1, "add_sub"), (2, "add_sub")]
