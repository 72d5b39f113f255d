"""A corrupt version dropped into a lazily served, evicted model never takes the model down."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import Reply, call

pytestmark = pytest.mark.integration
DOC = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 256],
                                "data": [0.1] * 256}]})


def _infer(server: RunningServer, model: str) -> Reply:
    return call(server.url, "POST", f"/v2/models/{model}/infer", DOC)


def _drop_version(model_dir: Path, version: str, model_bytes: bytes) -> None:
    staging = model_dir / f".incoming-{version}"
    staging.mkdir()
    (staging / "model.onnx").write_bytes(model_bytes)
    staging.rename(model_dir / version)


def _wait_for_version(server: RunningServer, model: str, version: str) -> Reply:
    deadline = time.monotonic() + 30
    while True:
        reply = _infer(server, model)
        if reply.status == 200 and reply.json()["model_version"] == version:
            return reply
        assert time.monotonic() < deadline, reply.body
        time.sleep(0.1)


def _wait_for_log(server: RunningServer, message: str) -> None:
    deadline = time.monotonic() + 30
    while message not in server.log():
        assert time.monotonic() < deadline, f"the server never logged {message!r}"
        time.sleep(0.05)


def test_an_evicted_model_keeps_its_last_good_version_then_takes_the_next(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    for name in ("m0", "m1"):
        fixture_models.heavy(tmp_path, name=name, layers=8, width=256)  # ~2.5 MB each
    server = server_factory(tmp_path, "--model-control", "lazy", "--memory-budget", "4MB",
                            "--poll-interval-s", "0.1")
    assert _infer(server, "m0").status == 200
    assert _infer(server, "m1").status == 200  # m0 is evicted to make room
    _drop_version(tmp_path / "m0", "2", b"\x08\x07 not an ONNX graph" * 50)
    _wait_for_log(server, "reload failed; serving versions keep serving")  # 2 did not load
    reply = _infer(server, "m0")
    assert reply.status == 200 and reply.json()["model_version"] == "1"
    _drop_version(tmp_path / "m0", "3", (tmp_path / "m0" / "1" / "model.onnx").read_bytes())
    _wait_for_version(server, "m0", "3")
    assert "model failed to load" in server.log()
    shutil.rmtree(tmp_path / "m0" / "2")
