"""A server under test in a child process: started in its own session, waited ready, stopped.

Used by `serval tune`'s temporary servers and by the benchmarks in bench/.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path

HOST = "127.0.0.1"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy


@contextlib.contextmanager
def running(command: list[str], port: int, ready_path: str, log: Path,
            env: Mapping[str, str] | None = None) -> Iterator[int]:
    """Run `command` until the block ends; yields the port once ready_path answers 200.
    `env` adds to (or overrides) this process's environment, for the child only."""
    with log.open("wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
                                   start_new_session=True)
        try:
            _wait_ready(process, port, ready_path, log)
            yield port
        finally:
            _stop(process)


def _wait_ready(process: subprocess.Popen[bytes], port: int, path: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"server exited early: {tail[0]} (log: {log})")
        with contextlib.suppress(OSError), DIRECT.open(f"http://{HOST}:{port}{path}",
                                                        timeout=1):
            return
        time.sleep(0.1)
    raise RuntimeError(f"server not ready after {READY_TIMEOUT_S:.0f} s (log: {log})")


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
