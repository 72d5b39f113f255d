"""Attacks on the scale-out path and on what the server reports about itself, against real
servers (and a real HAProxy where one is installed): figures must match what was sent."""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from serval.cluster.haproxy import Node, ProxySettings, render
from serval.cluster.local import ClusterSpec, LocalCluster
from serval.cluster.proxy import SOFT_STOP_RESEND_S, HaproxyProcess, RuntimeApi
from serval.cluster.status import NODE_TIMEOUT_S, cluster_status
from serval.ports import free_ports
from tests import fixture_models
from tests.conftest import EXAMPLES, RunningServer
from tests.integration.http_helpers import call, infer

pytestmark = pytest.mark.integration
needs_haproxy = pytest.mark.skipif(shutil.which("haproxy") is None,
                                   reason="HAProxy is not installed (make setup installs it)")
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
    repository = fixture_models.linked_repository(tmp_path / "many", source,
                                                  (f"m{index}" for index in range(6)))
    server = server_factory(repository, "--model-control", "lazy", "--metrics-top-k", "2")
    for index in range(5):  # m5 is never asked for: it does not serve
        assert infer(server.url, f"m{index}", X).status == 200
    metrics = call(server.url, "GET", "/metrics").body.decode()
    ready = _series(metrics, "serval_model_ready")
    assert len(ready) == 3 and any('model="_other"' in labels for labels in ready)
    assert sum(ready.values()) == 5, ready
    requests = _series(metrics, "serval_requests_total")
    assert sum(requests.values()) == 5, requests


@needs_haproxy
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


def _haproxy(tmp_path: Path, node_port: int) -> tuple[HaproxyProcess, int]:
    """A real HAProxy (a config `render` wrote) in front of one node; returns once it answers."""
    port, grpc_port = free_ports(2)
    tmp_path.mkdir(parents=True, exist_ok=True)
    config, sock = tmp_path / "haproxy.cfg", tmp_path / "haproxy.sock"
    config.write_text(render(ProxySettings(http_port=port, grpc_port=grpc_port,
                                           stats_socket=str(sock)),
                             [Node("node", "127.0.0.1", node_port, node_port)]))
    process = HaproxyProcess(config, tmp_path / "haproxy.log")
    process.start()
    assert RuntimeApi(sock).wait_ready(15), (tmp_path / "haproxy.log").read_text()
    return process, port


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


@needs_haproxy
def test_a_stop_right_after_the_proxy_came_up_is_not_lost(tmp_path: Path) -> None:
    """Ctrl-C on `cluster up` just after it started: HAProxy's master dropped the soft stop
    while it re-executed itself, and the stop waited out the whole grace (30 s) before a
    hard kill. Each of these stops must end the proxy well within its grace."""
    (absent,) = free_ports(1)
    for attempt in range(6):
        process, _ = _haproxy(tmp_path / str(attempt), absent)
        started = time.monotonic()
        process.stop(grace_s=20)
        assert time.monotonic() - started < 5, f"stop {attempt} waited out its grace"


@needs_haproxy
def test_the_soft_stop_sent_again_still_lets_a_request_in_flight_finish(
        tmp_path: Path) -> None:
    """The stop is sent until the proxy ends: a request the node is still answering must
    get its answer, not be cut by a repeated signal."""
    answered = threading.Event()
    with socket.socket() as node:
        node.bind(("127.0.0.1", 0))
        node.listen(8)

        def slow_node() -> None:
            while True:
                connection, _ = node.accept()
                with connection:
                    request = connection.recv(65536)
                    if b"/v2/health/ready" not in request:  # the proxy's probe: answered now
                        answered.wait(10)  # the model's request: once the stop was sent
                    connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n"
                                       b"connection: close\r\n\r\nok")
                    if b"/v2/health/ready" not in request:
                        return

        threading.Thread(target=slow_node, daemon=True).start()
        process, port = _haproxy(tmp_path, node.getsockname()[1])
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        client.request("GET", "/v2/models/m/ready")
        sent = time.monotonic()
        stopper = threading.Thread(target=process.stop, kwargs={"grace_s": 20})
        stopper.start()
        # the node answers once the proxy took the stop (its port closed) and the stop was
        # sent again at least twice since
        deadline = sent + 15
        while not (_refused(port) and time.monotonic() - sent > 3 * SOFT_STOP_RESEND_S):
            assert time.monotonic() < deadline, "the proxy never stopped listening"
            time.sleep(0.05)
        answered.set()
        reply = client.getresponse()
        assert (reply.status, reply.read()) == (200, b"ok")
        stopper.join(30)
        assert not process.alive()


@pytest.mark.parametrize(("output", "reason"), [
    ("missing/haproxy.cfg", "No such file or directory"), (".", "Is a directory")])
def test_proxy_config_to_a_path_it_cannot_write_says_why_in_one_line(
        tmp_path: Path, output: str, reason: str) -> None:
    target = tmp_path / output
    done = subprocess.run(
        [sys.executable, "-m", "serval", "cluster", "proxy-config", "--node",
         "n1=10.0.0.1:8000", "-o", str(target)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert lines == [f"serval: cannot write the configuration to {target}: {reason}"], lines


@needs_haproxy
def test_a_stopped_cluster_leaves_no_process_port_or_socket_file(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    fixture_models.linear(repository)
    http_port, grpc_port = free_ports(2)
    cluster = LocalCluster(ClusterSpec(repository, nodes=1, http_port=http_port,
                                       grpc_port=grpc_port, run_dir=tmp_path / "run"))
    cluster.start()
    try:
        assert infer(f"127.0.0.1:{http_port}", "linear", X).status == 200
        pids = [cluster.proxy.pid, *(node.pid for node in cluster.nodes)]
    finally:
        cluster.stop()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert _refused(http_port) and _refused(grpc_port)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()
                  if not p.name.endswith((".log", ".cfg"))) == []


@needs_haproxy
def test_cluster_status_asks_every_node_at_once_and_survives_a_node_that_is_not_serval(
        tmp_path: Path) -> None:
    """Four nodes that accept and never answer cost one timeout, not four in a row (64 hung
    nodes took 192 s); a node answering /status with something other than Serval's summary
    is a row without figures, not a crash."""
    silent = [socket.socket() for _ in range(4)]
    other = socket.socket()
    for sock in (*silent, other):
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)

    def not_serval() -> None:
        while True:
            try:
                connection, _ = other.accept()
            except OSError:
                return
            with connection:
                connection.recv(65536)
                connection.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                   b"content-length: 2\r\nconnection: close\r\n\r\n[]")

    threading.Thread(target=not_serval, daemon=True).start()
    port, sock_path = free_ports(1)[0], tmp_path / "haproxy.sock"
    nodes = [Node(f"n{i}", "127.0.0.1", s.getsockname()[1], id=i + 1)
             for i, s in enumerate([*silent, other])]
    config = tmp_path / "haproxy.cfg"
    config.write_text(render(ProxySettings(http_port=port, grpc_port=None,
                                           stats_socket=str(sock_path)), nodes))
    process = HaproxyProcess(config, tmp_path / "haproxy.log")
    process.start()
    try:
        assert RuntimeApi(sock_path).wait_ready(15)
        started = time.monotonic()
        rows = cluster_status(RuntimeApi(sock_path))
        took = time.monotonic() - started
    finally:
        process.stop(grace_s=5)
        for sock in (*silent, other):
            sock.close()
    assert [row.name for row in rows] == ["n0", "n1", "n2", "n3", "n4"]
    assert all(row.resident_models is None and row.hit_rate is None for row in rows)
    assert took < 2 * NODE_TIMEOUT_S, f"{took:.1f} s: the nodes were asked one after another"
