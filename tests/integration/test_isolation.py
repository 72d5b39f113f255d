"""`isolation: process`: a model that aborts or segfaults fails only its requests, then returns."""

from __future__ import annotations

import http.client
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import Reply, infer

pytestmark = pytest.mark.integration

CRASHY = """\
import ctypes
import os

import numpy as np


class Model:
    def load(self, ctx):
        pass

    def infer(self, inputs):
        x = inputs["x"]
        if (x == -1).any():
            os.abort()
        if (x == -2).any():
            ctypes.string_at(0)  # a segfault
        if (x == -3).any():
            raise ValueError("a python error, not a crash")
        pid = np.full((x.shape[0], 1), os.getpid(), dtype=np.int64)
        return {"y": x * 2, "pid": pid}
"""
CRASHY_CONFIG = """\
backend: python
isolation: process
max_batch_size: 8
inputs: [{name: x, datatype: FP32, dims: [4]}]
outputs: [{name: y, datatype: FP32, dims: [4]}, {name: pid, datatype: INT64, dims: [1]}]
"""


def _x(value: float, rows: int = 1) -> dict[str, object]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4],
                        "data": [value] * (4 * rows)}]}


def _linear_x() -> dict[str, object]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8],
                        "data": [0.25 * i for i in range(16)]}]}


def _worker_pid(reply: Reply) -> int:
    outputs = {o["name"]: o for o in reply.json()["outputs"]}
    return int(outputs["pid"]["data"][0])


@pytest.fixture(scope="module")
def isolated(server_factory: Callable[..., RunningServer],
             tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("isolated")
    fixture_models.linear(root)
    fixture_models.linear(root, "linear_iso", "max_batch_size: 32\nisolation: process\n")
    fixture_models.linear(root, "linear_pool",
                          "max_batch_size: 32\nisolation: process\ninstances: 2\n")
    for name in ("crashy", "crash_loop"):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(CRASHY)
        (root / name / "config.yaml").write_text(CRASHY_CONFIG)
    return server_factory(root, "--allow-python-models")


def test_an_isolated_onnx_model_answers_like_the_in_process_one(isolated: RunningServer) -> None:
    direct = infer(isolated.url, "linear", _linear_x())
    remote = infer(isolated.url, "linear_iso", _linear_x())
    assert direct.status == remote.status == 200
    assert direct.json()["outputs"][0]["data"] == remote.json()["outputs"][0]["data"]


def test_the_engine_runs_in_its_own_process(isolated: RunningServer) -> None:
    reply = infer(isolated.url, "crashy", _x(1.5, rows=3))
    assert reply.status == 200
    outputs = {o["name"]: o for o in reply.json()["outputs"]}
    assert outputs["y"]["data"] == [3.0] * 12
    assert _worker_pid(reply) != isolated.process.pid


@pytest.mark.parametrize(("poison", "signal_name"), [(-1, "SIGABRT"), (-2, "SIGSEGV")])
def test_a_crash_fails_only_its_requests_and_the_worker_comes_back(
        isolated: RunningServer, poison: float, signal_name: str) -> None:
    first_pid = _worker_pid(infer(isolated.url, "crashy", _x(1.0)))
    others: list[int] = []
    stop = threading.Event()

    def other_traffic() -> None:
        while not stop.is_set():
            others.append(infer(isolated.url, "linear", _linear_x()).status)

    traffic = threading.Thread(target=other_traffic)
    traffic.start()
    try:
        crashed = infer(isolated.url, "crashy", _x(poison))
        after = infer(isolated.url, "crashy", _x(1.0))  # waits for the restart
    finally:
        stop.set()
        traffic.join(timeout=30)
    assert crashed.status == 500
    assert f"worker process died (killed by {signal_name})" in crashed.error
    assert "being restarted" in crashed.error
    assert after.status == 200 and _worker_pid(after) != first_pid
    assert others and set(others) == {200}
    assert isolated.process.poll() is None
    assert "isolated model worker died; restarting it" in isolated.log()


def test_a_worker_crashed_again_and_again_restarts_later_and_later(
        isolated: RunningServer) -> None:
    """A client crashing the worker on purpose cannot make the server start processes back
    to back: past three crashes in a row the restart waits (1 s, then 2 s...) and requests
    meanwhile get a 503 / UNAVAILABLE saying when it comes back."""
    first_pid = _worker_pid(infer(isolated.url, "crash_loop", _x(1.0)))
    errors = [infer(isolated.url, "crash_loop", _x(-1)) for _ in range(4)]
    assert [reply.status for reply in errors] == [500] * 4
    assert all("being restarted" in reply.error for reply in errors[:3])
    assert "has crashed 4 times in a row and restarts in 1.0 s" in errors[3].error
    _wait_until_back(isolated, "crash_loop")
    assert "has crashed 5 times in a row and restarts in 2.0 s" in \
        infer(isolated.url, "crash_loop", _x(-1)).error
    # within the 2 s it waits: on a keep-alive connection a 503 that says when to come back;
    # over gRPC UNAVAILABLE; and the connection sending again before then is refused (429)
    # unread when that elapses
    connection = http.client.HTTPConnection("127.0.0.1", isolated.port, timeout=30)
    held = orjson.dumps(_x(1.0))
    connection.request("POST", "/v2/models/crash_loop/infer", body=held)
    first = connection.getresponse()
    first_error = orjson.loads(first.read())["error"]
    assert first.status == 503, first_error
    assert "has crashed 5 times in a row; it restarts in" in first_error
    assert first.getheader("retry-after") in ("1", "2")
    client = grpcclient.InferenceServerClient(isolated.grpc_url)
    x = grpcclient.InferInput("x", [1, 4], "FP32")
    x.set_data_from_numpy(np.ones((1, 4), np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("crash_loop", [x])
    assert caught.value.status() == "StatusCode.UNAVAILABLE"
    assert "has crashed 5 times in a row; it restarts in" in caught.value.message()
    client.close()
    connection.request("POST", "/v2/models/crash_loop/infer", body=held)
    again = connection.getresponse()
    assert again.status == 429
    assert "before its Retry-After elapsed" in orjson.loads(again.read())["error"]
    connection.close()
    back = _wait_until_back(isolated, "crash_loop")
    assert _worker_pid(back) != first_pid
    assert infer(isolated.url, "linear", _linear_x()).status == 200


def _wait_until_back(server: RunningServer, model: str) -> Reply:
    """The first 200 of a model whose restart is held (503 until then), within 30 s."""
    deadline = time.monotonic() + 30
    while (reply := infer(server.url, model, _x(1.0))).status == 503:
        assert time.monotonic() < deadline, reply.error
        time.sleep(0.05)
    assert reply.status == 200, reply.error
    return reply


def _started_workers(server: RunningServer, model: str) -> list[int]:
    """The pids the server's log names as started worker processes of `model`."""
    lines = [orjson.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    return [line["pid"] for line in lines
            if line.get("msg") == "isolated model worker started" and line.get("model") == model]


def test_an_engine_with_two_instances_runs_in_two_worker_processes(
        isolated: RunningServer) -> None:
    """instances: 2 of an isolated ONNX model: two children of the server (each with one
    session on half the cores), batches taking turns; one killed fails only the batch it
    had, and the other serves on."""
    pids = _started_workers(isolated, "linear_pool")
    assert len(set(pids)) == 2, pids
    for pid in pids:
        status = Path(f"/proc/{pid}/status").read_text()
        assert f"PPid:\t{isolated.process.pid}\n" in status
    expected = infer(isolated.url, "linear", _linear_x()).json()["outputs"][0]["data"]
    os.kill(pids[0], signal.SIGKILL)
    replies = [infer(isolated.url, "linear_pool", _linear_x()) for _ in range(4)]
    assert [reply.status for reply in replies].count(500) == 1  # only the one it had
    assert all(reply.json()["outputs"][0]["data"] == expected
               for reply in replies if reply.status == 200)
    deadline = time.monotonic() + 30  # the killed one, anew: restarted in the background,
    while len(set(_started_workers(isolated, "linear_pool"))) < 3:  # its sibling serving
        assert time.monotonic() < deadline, _started_workers(isolated, "linear_pool")
        time.sleep(0.05)


def test_a_python_error_does_not_restart_the_worker(isolated: RunningServer) -> None:
    pid = _worker_pid(infer(isolated.url, "crashy", _x(1.0)))
    failed = infer(isolated.url, "crashy", _x(-3))
    assert failed.status == 500 and "failed to run" in failed.error
    assert _worker_pid(infer(isolated.url, "crashy", _x(1.0))) == pid


def test_isolation_is_refused_for_a_pipeline(server_factory: Callable[..., RunningServer],
                                             tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    (tmp_path / "pipe" / "1").mkdir(parents=True)
    (tmp_path / "pipe" / "config.yaml").write_text(
        "backend: pipeline\nisolation: process\n"
        "inputs: [{name: x, datatype: FP32, dims: [8]}]\n"
        "outputs: [{name: p, datatype: FP32, dims: [4]}]\n"
        "steps: [{model: linear, inputs: {x: x}, outputs: {probabilities: p}}]\n")
    server = server_factory(tmp_path, "--model-control", "lazy")
    reply = infer(server.url, "pipe", {"inputs": [{"name": "x", "datatype": "FP32",
                                                   "shape": [1, 8], "data": [0.0] * 8}]})
    assert reply.status == 503 and "does not apply to a pipeline" in reply.error


def test_shutdown_stops_the_worker_processes(server_factory: Callable[..., RunningServer],
                                             tmp_path: Path) -> None:
    fixture_models.linear(tmp_path, "linear_iso", "max_batch_size: 32\nisolation: process\n")
    server = server_factory(tmp_path)
    assert infer(server.url, "linear_iso", _linear_x()).status == 200
    parent = server.process.pid
    children = [pid for task in Path(f"/proc/{parent}/task").iterdir()
                for pid in (task / "children").read_text().split()]  # spawned from threads
    assert children, "the isolated model has a worker process"
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=60) == 0
    assert not any(Path(f"/proc/{pid}/cmdline").exists() and
                   b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
                   for pid in children)
