"""`serval loadtest` as a user runs it: over gRPC with only the gRPC address, and a test whose
requests the server refuses fails at once with the server's reason (never exit 0 on errors)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RunningServer

pytestmark = pytest.mark.integration

_QUICK = ["--duration", "0.5s", "--warmup", "0s", "-c", "2", "--no-ceiling", "--format", "json"]


def _loadtest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serval", "loadtest", *args],
                          capture_output=True, text=True, timeout=120)


def test_grpc_needs_only_the_grpc_address(server: RunningServer) -> None:
    done = _loadtest(server.grpc_url, "--grpc", "-m", "linear", *_QUICK)
    assert done.returncode == 0, done.stderr
    step = json.loads(done.stdout)[0]
    assert step["throughput_rps"] > 0 and not step["errors"]


@pytest.mark.parametrize("grpc", [False, True], ids=["http", "grpc"])
def test_refused_requests_fail_with_the_servers_reason(server: RunningServer, tmp_path: Path,
                                                       grpc: bool) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"inputs": [{"name": "nope", "datatype": "FP32", "shape": [1, 8],
                                           "data": [0.5] * 8}]}))
    target = server.grpc_url if grpc else f"http://{server.url}"
    done = _loadtest(target, *(["--grpc"] if grpc else []), "-m", "linear",
                     "--input-file", str(bad), *_QUICK)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "refused the test's first request" in lines[0]
    assert "INVALID_ARGUMENT" in lines[0] if grpc else "HTTP 400" in lines[0]
    assert "has no input 'nope'" in lines[0] and "Traceback" not in done.stderr


def test_a_grpc_test_against_the_http_port_says_so(server: RunningServer) -> None:
    done = _loadtest(server.url, "--grpc", "-m", "linear", *_QUICK)
    assert done.returncode != 0
    assert "is this a v2 gRPC port?" in done.stderr and "Traceback" not in done.stderr


def test_an_unknown_model_over_grpc_is_named(server: RunningServer) -> None:
    done = _loadtest(server.grpc_url, "--grpc", "-m", "missing", *_QUICK)
    assert done.returncode != 0
    assert "model 'missing'" in done.stderr and "NOT_FOUND" in done.stderr
