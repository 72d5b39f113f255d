"""Start and stop the servers under test as subprocesses on free loopback ports."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson

HOST = "127.0.0.1"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running(command: list[str], port: int, ready_path: str, log: Path) -> Iterator[int]:
    """Run `command` until the block ends; yields the port once ready_path answers 200."""
    with log.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                   start_new_session=True)
        try:
            _wait_ready(process, port, ready_path, log)
            yield port
        finally:
            _stop(process)


def serval_command(repository: Path, port: int, workers: int, grpc_port: int) -> list[str]:
    return [sys.executable, "-m", "serval", "serve", "--repository", str(repository),
            "--host", HOST, "--http-port", str(port), "--grpc-port", str(grpc_port),
            "--workers", str(workers), "--log-level", "warning"]


def fastapi_command(repository: Path, port: int) -> list[str]:
    script = Path(__file__).with_name("baseline_fastapi.py")
    return [sys.executable, str(script), "--repository", str(repository), "--port", str(port)]


def trivial_command(port: int) -> list[str]:
    return [sys.executable, str(Path(__file__).with_name("trivial_server.py")), "--port", str(port)]


def get_json(port: int, path: str) -> dict:
    with _DIRECT.open(f"http://{HOST}:{port}{path}", timeout=10) as reply:
        return dict(orjson.loads(reply.read()))


def _wait_ready(process: subprocess.Popen[bytes], port: int, path: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited early; see {log}")
        try:
            with _DIRECT.open(f"http://{HOST}:{port}{path}", timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"server not ready after {READY_TIMEOUT_S:.0f} s; see {log}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (workers included), SIGKILL it if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
