"""`--workers N` under a supervisor: a worker killed is restarted and the port keeps serving."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from serval.backends.cores import usable_cores
from serval.server.supervisor import STARTUP_FAILED, Supervisor
from tests import fixture_models
from tests.conftest import RunningServer, free_port
from tests.integration.http_helpers import infer

pytestmark = pytest.mark.integration
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}


def worker_pids(parent: int) -> set[int]:
    """The serving processes the supervisor started (not multiprocessing's resource tracker)."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    workers = set()
    for pid in map(int, children):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                workers.add(pid)
        except FileNotFoundError:
            continue
    return workers


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


def _workers_when(parent: int, predicate: Callable[[set[int]], bool],
                  timeout_s: float = 60.0) -> set[int]:
    """The first snapshot of the worker pids that satisfies predicate (one read, no race)."""
    deadline = time.monotonic() + timeout_s
    while not predicate(workers := worker_pids(parent)):
        assert time.monotonic() < deadline, f"workers never satisfied the condition: {workers}"
        time.sleep(0.1)
    return workers


def test_a_killed_worker_is_restarted_and_shutdown_still_drains(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    server = server_factory(tmp_path, "--workers", "2")
    parent = server.process.pid
    before = _workers_when(parent, lambda workers: len(workers) == 2)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    after = _workers_when(parent, lambda workers: len(workers) == 2 and victim not in workers)
    replacement = after - before
    assert len(replacement) == 1 and after - replacement == before - {victim}, (before, after)
    serving = '"msg":"serving"'
    _wait_for(lambda: any(serving in line and f'"pid":{pid}' in line
                          for line in server.log().splitlines() for pid in replacement))
    statuses = [infer(server.url, "linear", X).status for _ in range(40)]
    assert statuses == [200] * 40  # fresh connections, spread over both workers by the kernel
    assert "worker process died; restarting it" in server.log()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=60) == 0
    assert not any(Path(f"/proc/{pid}").exists() for pid in (before - {victim}) | replacement)


def test_workers_for_an_engine_bound_model_are_refused_in_one_line(tmp_path: Path) -> None:
    fixture_models.heavy(tmp_path, "big", layers=64, width=2048, shared_weight=True)
    done = subprocess.run([sys.executable, "-m", "serval", "serve", "--repository",
                           str(tmp_path), "--http-port", "18999", "--grpc-port", "0",
                           "--workers", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if not line.startswith("{")]
    assert len(said) == 1 and "engine-bound model big" in said[0], done.stderr
    assert "Traceback" not in done.stderr and str(tmp_path) not in said[0]


def test_auto_workers_serve_http_bound_models_from_a_process_per_core(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    server = server_factory(tmp_path, "--workers", "auto")
    expected = max(1, min(usable_cores(), 64))
    if expected > 1:  # one worker serves in the supervisor's own process
        _workers_when(server.process.pid, lambda pids: len(pids) == expected)
    assert '"why":"auto: ' in server.log()
    assert [infer(server.url, "linear", X).status for _ in range(10)] == [200] * 10


def _serve_workers(repository: Path, http_port: int, grpc_port: int
                   ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serval", "serve", "--repository",
                           str(repository), "--http-port", str(http_port), "--grpc-port",
                           str(grpc_port), "--workers", "2"],
                          capture_output=True, text=True, timeout=120)


def test_workers_on_a_port_in_use_are_refused_in_one_line(tmp_path: Path) -> None:
    """Each worker binds with SO_REUSEPORT: without a check first they failed and were
    restarted for ever (a plain socket on the port) or shared it with another server."""
    fixture_models.linear(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve_workers(tmp_path, port, 0)
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if not line.startswith("{")]
    assert len(said) == 1 and f"cannot listen on 127.0.0.1:{port} (--http-port)" in said[0], (
        done.stderr)
    assert "Traceback" not in done.stderr


def test_a_second_server_with_workers_cannot_share_a_running_ones_port(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    first = server_factory(tmp_path, "--workers", "2")
    _workers_when(first.process.pid, lambda workers: len(workers) == 2)
    for http_port, grpc_port, flag in ((first.port, 0, "--http-port"),
                                       (free_port(), first.grpc_port, "--grpc-port")):
        done = _serve_workers(tmp_path, http_port, grpc_port)
        assert done.returncode != 0, done.stderr
        assert f"({flag}): Address already in use" in done.stderr
    assert [infer(first.url, "linear", X).status for _ in range(10)] == [200] * 10


def test_a_worker_that_cannot_start_stops_them_all() -> None:
    """A worker exiting with STARTUP_FAILED would fail again: no restart loop."""
    supervisor = Supervisor(3, _exit_with, (STARTUP_FAILED,))
    started = time.monotonic()
    assert supervisor.run() == STARTUP_FAILED
    assert supervisor.restarts == 0 and time.monotonic() - started < 30
    assert all(worker is not None and not worker.is_alive() for worker in supervisor.workers)


def _exit_with(code: int) -> None:
    raise SystemExit(code)
