"""Attacks on the scale-out path and on what the server reports about itself, against real
servers (and a real HAProxy where one is installed): figures must match what was sent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from serval.ports import free_ports
from tests import fixture_models
from tests.conftest import EXAMPLES, RunningServer
from tests.integration.http_helpers import call, infer

pytestmark = pytest.mark.integration
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}


def _series(metrics: str, name: str) -> dict[str, float]:
    """`name{labels} value` lines of a Prometheus scrape, by their label text."""
    found = {}
    for line in metrics.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line[len(name):].rpartition(" ")
            found[labels] = float(value)
    return found


def test_models_ready_summed_over_every_series_counts_every_ready_model(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    """With more models than --metrics-top-k, the rest share model="_other": its
    serval_model_ready must count how many of them serve (the dashboard's "Models ready" is
    the sum), not 1 for all of them together."""
    source = fixture_models.linear(tmp_path / "build")
    repository = tmp_path / "many"
    for index in range(6):
        version = repository / f"m{index}" / "1"
        version.mkdir(parents=True)
        os.link(source, version / "model.onnx")
    server = server_factory(repository, "--model-control", "lazy", "--metrics-top-k", "2")
    for index in range(5):  # m5 is never asked for: it does not serve
        assert infer(server.url, f"m{index}", X).status == 200
    metrics = call(server.url, "GET", "/metrics").body.decode()
    ready = _series(metrics, "serval_model_ready")
    assert len(ready) == 3 and any('model="_other"' in labels for labels in ready)
    assert sum(ready.values()) == 5, ready
    requests = _series(metrics, "serval_requests_total")
    assert sum(requests.values()) == 5, requests


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="HAProxy is not installed")
@pytest.mark.parametrize(("host", "expected"), [
    ("10.255.255.1", "--host 10.255.255.1 is not an address of this machine"),
    ("nonexistent.invalid", "--host 'nonexistent.invalid' does not resolve"),
])
def test_cluster_up_on_an_address_not_of_this_machine_says_so_not_port_in_use(
        host: str, expected: str) -> None:
    http_port, grpc_port = free_ports(2)
    done = subprocess.run(
        [sys.executable, "-m", "serval", "cluster", "up", "-r", str(EXAMPLES), "--host", host,
         "--http-port", str(http_port), "--grpc-port", str(grpc_port)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "in use" not in lines[0], lines
