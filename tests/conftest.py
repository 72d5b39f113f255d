"""Shared fixtures: a real `serval serve` process on a free loopback port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from serval.ports import free_port as free_port  # tests import it from here
from serval.ports import free_ports

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "models"


@dataclass
class RunningServer:
    """A serval process started for a test; url is host:port for tritonclient."""

    process: subprocess.Popen[bytes]
    port: int
    grpc_port: int
    log_path: Path
    agent_port: int | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_server(repository: Path | None, log_path: Path, *extra: str, agent: bool = False,
                 timeout_s: float = 60.0) -> RunningServer:
    """Start `python -m serval serve` and wait until it has started: /v2/health/ready answers
    200, or 503 because a model that should serve does not (strict readiness; the test wants
    that model broken). `agent`: it answers HAProxy's agent checks too, on a port of its own.
    A repository of None is not passed (`extra` names it, as a tritonserver command would)."""
    ports = free_ports(3 if agent else 2)
    port, grpc_port, agent_port = ports[0], ports[1], ports[2] if agent else None
    command = [sys.executable, "-m", "serval", "serve",
               *(["--repository", str(repository)] if repository else []),
               "--http-port", str(port), "--grpc-port", str(grpc_port),
               *(["--agent-port", str(agent_port)] if agent_port else []), *extra]
    log_file = log_path.open("wb")
    process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    server = RunningServer(process, port, grpc_port, log_path, agent_port)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"serval exited with {process.returncode}:\n{server.log()}")
        try:
            with urllib.request.urlopen(f"{server.base}/v2/health/ready", timeout=1) as reply:
                if reply.status == 200:
                    return server
        except urllib.error.HTTPError as exc:
            if exc.code == 503 and b"should serve" in exc.read():
                return server
            time.sleep(0.1)
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"serval did not become ready in {timeout_s} s:\n{server.log()}")


_IN_TEST_BODY: list[RunningServer] | None = None  # servers a running test started itself
_SETTING_UP: list[pytest.FixtureDef[object]] = []  # fixtures being set up, innermost last
_OF_FIXTURE: dict[int, list[RunningServer]] = {}  # servers by the fixture (id) that started them


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Servers a test starts in its own body are stopped when it ends: left running, each kept
    its timers and repository poll going (one polling 3,000 folders every 0.1 s took 44% of a
    core for the rest of the run) and its memory (~0.5 GB with the example models)."""
    global _IN_TEST_BODY
    _IN_TEST_BODY = []
    try:
        yield
    finally:
        started, _IN_TEST_BODY = _IN_TEST_BODY, None
        stop_all(started)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[object]) -> Iterator[None]:
    """Servers a fixture starts belong to it (see pytest_fixture_post_finalizer)."""
    _SETTING_UP.append(fixturedef)
    try:
        yield
    finally:
        _SETTING_UP.pop()


def pytest_fixture_post_finalizer(fixturedef: pytest.FixtureDef[object]) -> None:
    """A fixture's servers stop when its scope ends (a module fixture's at the module's end),
    not at the session's."""
    stop_all(_OF_FIXTURE.pop(id(fixturedef), []))


def stop_all(servers: list[RunningServer], grace_s: float = 10.0) -> None:
    """SIGTERM every server at once, then wait for each (SIGKILL past the grace)."""
    for server in servers:
        if server.process.poll() is None:
            server.process.terminate()
    deadline = time.monotonic() + grace_s
    for server in servers:
        try:
            server.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Start servers on demand; each lives as long as what started it: the fixture (its
    scope), or the test whose body started it."""
    started: list[RunningServer] = []

    def factory(repository: Path | None, *extra: str, agent: bool = False) -> RunningServer:
        log_path = tmp_path_factory.mktemp("serval-log") / "server.log"
        server = start_server(repository, log_path, *extra, agent=agent)
        started.append(server)
        if _SETTING_UP:
            _OF_FIXTURE.setdefault(id(_SETTING_UP[-1]), []).append(server)
        elif _IN_TEST_BODY is not None:
            _IN_TEST_BODY.append(server)
        return server

    yield factory
    stop_all(started)
