"""Attacks on a real server: its memory, and a well-behaved client answered while they run.

Every test here drives `serval serve` on loopback with raw sockets or raw HTTP/2 frames. The
`watch` context samples the server's RSS (peak growth over the attack) and runs `GoodClient`s
beside the attacker: HTTP and gRPC calls, one at a time, whose worst latency the test checks.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import infer

Factory = Callable[..., RunningServer]
INFER_DOC = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}


def rss_mib(pid: int) -> float:
    """Resident memory of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def security_repository(root: Path) -> Path:
    fixture_models.linear(root)
    return root


@pytest.fixture(scope="module")
def guarded(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    """A server with default limits serving the `linear` model on HTTP and gRPC."""
    return server_factory(security_repository(tmp_path_factory.mktemp("security")))


@dataclass
class GoodClient:
    """Calls the server one request at a time on a thread; remembers the slowest and failures."""

    server: RunningServer
    grpc: bool = False
    token: str | None = None  # a bearer token, for a server with auth on
    worst_s: float = 0.0
    calls: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    first_call: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> GoodClient:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        client = triton_grpc.InferenceServerClient(self.server.grpc_url) if self.grpc else None
        x = triton_grpc.InferInput("x", [1, 8], "FP32")
        x.set_data_from_numpy(np.full((1, 8), 0.5, dtype=np.float32))
        auth = {"authorization": f"Bearer {self.token}"} if self.token else None
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                if client is not None:
                    client.infer("linear", [x], client_timeout=5.0, headers=auth)
                else:
                    reply = infer(self.server.url, "linear", INFER_DOC, auth)
                    if reply.status != 200:
                        self.failures.append(f"HTTP {reply.status}")
            except triton_grpc.InferenceServerException as exc:
                self.failures.append(f"gRPC {exc.status()}: {exc.message()}"[:200])
            except Exception as exc:
                self.failures.append(repr(exc)[:200])
            self.worst_s = max(self.worst_s, time.perf_counter() - started)
            self.calls += 1
            self.first_call.set()
            self._stop.wait(0.02)


@dataclass
class Watch:
    """What an attack did to the server: peak RSS growth and the good clients' experience."""

    baseline_mib: float
    peak_mib: float
    clients: list[GoodClient]

    @property
    def growth_mib(self) -> float:
        return self.peak_mib - self.baseline_mib

    def assert_held(self, max_growth_mib: float = 200.0, max_latency_s: float = 1.0) -> None:
        assert self.growth_mib <= max_growth_mib, f"RSS grew {self.growth_mib:.0f} MiB"
        for client in self.clients:
            kind = "gRPC" if client.grpc else "HTTP"
            assert client.calls > 0, f"the {kind} client made no call"
            assert not client.failures, f"{kind} client failures: {client.failures[:3]}"
            assert client.worst_s <= max_latency_s, (
                f"{kind} client waited {client.worst_s:.2f} s")


@contextmanager
def watch(server: RunningServer, clients: bool = True,
          token: str | None = None) -> Iterator[Watch]:
    """Sample the server's RSS every 20 ms while the block runs; good clients beside it (with
    `token` as their bearer token where the server has auth on)."""
    pid = server.process.pid
    result = Watch(rss_mib(pid), rss_mib(pid), [])
    if clients:
        result.clients = [GoodClient(server, token=token).start(),
                          GoodClient(server, grpc=True, token=token).start()]
        for client in result.clients:  # each has been answered once before the attack starts
            assert client.first_call.wait(30.0), "a good client got no first answer"
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            result.peak_mib = max(result.peak_mib, rss_mib(pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield result
    finally:
        stop.set()
        sampler.join()
        for client in result.clients:
            client.stop()


def connect(port: int, timeout_s: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout_s)


def closed_within(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything the server sends until it closes the connection; fails if it stays open."""
    sock.settimeout(timeout_s)
    received = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return received
        except TimeoutError:
            break
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"the server kept the connection open past {timeout_s} s")
