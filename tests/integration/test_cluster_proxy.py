"""Serval nodes behind a real HAProxy, driven with tritonclient over HTTP and gRPC: a model's
requests stay on one node at low load, spill to more under load, survive a node killed
mid-load, and reach a node added later; `serval cluster up/status/add-node/remove-node`."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from serval.cluster.haproxy import ProxySettings
from serval.cluster.local import ClusterSpec, LocalCluster
from serval.ports import free_port, free_ports
from tests import fixture_models

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None,
                                reason="HAProxy is not installed (make setup installs it)")

MODELS = [f"m{i}" for i in range(12)]
WIDE = 40_000  # features of `wide`: one row is a 160 KB gRPC message, past the proxy's buffer
HOT_RATE = 40  # requests/s: the sequential low-load phases stay under it
X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cluster-models")
    for index, name in enumerate(MODELS):
        fixture_models.linear(root, name, seed=index)
    fixture_models.linear(root, "wide", features=WIDE)
    return root


@pytest.fixture(scope="module")
def cluster(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    http_port, grpc_port = free_ports(2)
    spec = ClusterSpec(repository, nodes=3, http_port=http_port, grpc_port=grpc_port,
                       proxy=ProxySettings(hot_rate=HOT_RATE, check_interval_ms=500),
                       run_dir=tmp_path_factory.mktemp("cluster-run"))
    local = LocalCluster(spec)
    local.start()
    try:
        yield local
    finally:
        local.stop()


def _http(cluster: LocalCluster) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(f"127.0.0.1:{cluster.spec.http_port}")


def _grpc(cluster: LocalCluster) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(f"127.0.0.1:{cluster.spec.grpc_port}")


def _infer_http(client: httpclient.InferenceServerClient, model: str) -> np.ndarray:
    tensor = httpclient.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X, binary_data=True)
    return client.infer(model, [tensor]).as_numpy("probabilities")


def _infer_grpc(client: grpcclient.InferenceServerClient, model: str) -> np.ndarray:
    tensor = grpcclient.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    return client.infer(model, [tensor]).as_numpy("probabilities")


def _served(cluster: LocalCluster, model: str) -> Counter[str]:
    """Inferences of MODEL per node, from each node's own statistics (not the proxy's)."""
    counts: Counter[str] = Counter()
    for local in cluster.nodes:
        if not local.alive():
            continue
        node = local.node
        connection = http.client.HTTPConnection(node.host, node.http_port, timeout=5)
        try:
            connection.request("GET", f"/v2/models/{model}/stats")
            response = connection.getresponse()
            body = response.read()
        except OSError:  # (re)starting: not listening yet
            continue
        finally:
            connection.close()
        if response.status == 200:
            stats = orjson.loads(body)["model_stats"]
            counts[node.name] += sum(int(s.get("inference_count", 0)) for s in stats)
    return +counts


def _home(cluster: LocalCluster, model: str) -> str:
    """The node that answers MODEL at low load (read from the serval-node header)."""
    connection = http.client.HTTPConnection("127.0.0.1", cluster.spec.http_port, timeout=10)
    connection.request("GET", f"/v2/models/{model}")
    response = connection.getresponse()
    response.read()
    connection.close()
    assert response.status == 200
    return str(response.getheader("serval-node"))


class Load:
    """Threads calling infer in a loop over HTTP and gRPC until stopped; every failure kept."""

    def __init__(self, cluster: LocalCluster, models: list[str], threads: int) -> None:
        self.cluster, self.models = cluster, models
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.done = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def _run(self, index: int) -> None:
        use_grpc = index % 2 == 1
        client = _grpc(self.cluster) if use_grpc else _http(self.cluster)
        call: Callable[[object, str], np.ndarray] = _infer_grpc if use_grpc else _infer_http
        turn = index
        while not self.stop.is_set():
            model = self.models[turn % len(self.models)]
            turn += 1
            try:
                out = call(client, model)
                assert out.shape == (1, 4)
                with self.lock:
                    self.done += 1
            except Exception as exc:
                with self.lock:
                    self.errors.append(f"{'grpc' if use_grpc else 'http'} {model}: {exc}")
        client.close()

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def wait_for(self, count: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.done < count and time.monotonic() < deadline and not self.errors:
            time.sleep(0.02)


def test_at_low_load_each_models_requests_stay_on_one_node(cluster: LocalCluster) -> None:
    models = MODELS[:6]
    http_client, grpc_client = _http(cluster), _grpc(cluster)
    for model in models:
        for _ in range(4):
            _infer_http(http_client, model)
            _infer_grpc(grpc_client, model)
    homes = {}
    for model in models:
        served = _served(cluster, model)
        assert len(served) == 1 and sum(served.values()) == 8, (model, served)
        homes[model] = next(iter(served))
    assert len(set(homes.values())) > 1, homes  # the ring spreads models over nodes


def test_a_percent_encoded_name_routes_as_the_name_itself(cluster: LocalCluster) -> None:
    """`/v2/models/m%34` is `m4` to the nodes, so it goes to m4's node: spelling a name
    differently must not make a model load on more nodes."""
    for model in MODELS:
        spelled = model[0] + "".join(f"%{ord(c):02X}" for c in model[1:])
        assert _home(cluster, spelled) == _home(cluster, model), model


def test_a_grpc_message_larger_than_the_proxys_buffer_is_routed_by_its_model(
        cluster: LocalCluster) -> None:
    """The proxy reads the model's name from the first bytes of the message, so a request whose
    message does not fit the proxy's buffer still lands on the model's node."""
    client = _grpc(cluster)
    x = np.linspace(-1, 1, WIDE, dtype=np.float32).reshape(1, WIDE)
    for _ in range(6):
        tensor = grpcclient.InferInput("x", [1, WIDE], "FP32")
        tensor.set_data_from_numpy(x)
        assert client.infer("wide", [tensor]).as_numpy("probabilities").shape == (1, 4)
    served = _served(cluster, "wide")
    assert len(served) == 1 and sum(served.values()) == 6, served


def test_a_hot_model_spills_to_more_nodes_under_load(cluster: LocalCluster) -> None:
    with Load(cluster, ["m6"], threads=12) as load:
        load.wait_for(3000)
    assert load.errors == []
    served = _served(cluster, "m6")
    assert len(served) >= 2, served
    assert sum(served.values()) >= 3000


def test_a_node_killed_mid_load_fails_no_request_and_comes_back(cluster: LocalCluster) -> None:
    models = MODELS[7:]
    victim = cluster.node(_home(cluster, models[0]))
    assert victim.process is not None
    with Load(cluster, models, threads=6) as load:
        load.wait_for(300)
        victim.process.kill()
        victim.process.wait()
        before = load.done
        load.wait_for(before + 1500)
        assert load.done > before, "no request succeeded after the kill"
        deadline = time.monotonic() + 60
        while not victim.alive() and time.monotonic() < deadline:
            cluster.watch()  # what `serval cluster up` runs: the node is restarted
            time.sleep(0.05)
        assert victim.alive()
        deadline = time.monotonic() + 60  # the proxy's health check sees it: it serves again
        while time.monotonic() < deadline and not any(
                _served(cluster, model).get(victim.node.name) for model in models):
            time.sleep(0.1)
        assert any(_served(cluster, model).get(victim.node.name) for model in models)
        load.wait_for(load.done + 300)
    assert load.errors == [], load.errors[:5]


def test_a_node_killed_under_a_hot_models_load_fails_no_request(
        repository: Path, tmp_path: Path) -> None:
    """Two nodes share a hot model with bounded load. The killed one has nothing in flight, so
    it looks the least loaded while the other is over its share: before, every retry went
    back to it (~1,000 failures in the 2 s before the probes noticed). Its failed connections
    now take it out of the ring at once."""
    http_port, grpc_port = free_ports(2)
    spec = ClusterSpec(repository, nodes=2, http_port=http_port, grpc_port=grpc_port,
                       proxy=ProxySettings(hot_rate=HOT_RATE), run_dir=tmp_path)
    pair = LocalCluster(spec)
    pair.start()
    try:
        for victim in pair.nodes:  # one of the two is the model's home on the ring
            assert victim.process is not None
            with Load(pair, [MODELS[5]], threads=8) as load:
                load.wait_for(1500)
                victim.process.kill()
                victim.process.wait()
                load.wait_for(load.done + 3000)
                deadline = time.monotonic() + 60
                while not victim.alive() and time.monotonic() < deadline:
                    pair.watch()
                    time.sleep(0.05)
            # Before: ~1,200 failures per kill of the ring's first node. What is left, seen
            # once in a full run: a gRPC call in flight on the killed node whose stream the
            # proxy refused (REFUSED_STREAM), which grpcio does not retry by itself.
            assert len(load.errors) <= 2, (len(load.errors), load.errors[:3])
            deadline = time.monotonic() + 60  # back in every backend before the next kill
            while time.monotonic() < deadline and not all(
                    stat.status.startswith("UP") for stat in pair.api.servers()
                    if stat.name == victim.node.name):
                time.sleep(0.1)
    finally:
        pair.stop()


def test_a_node_added_takes_its_share_of_models(cluster: LocalCluster) -> None:
    before = {model: _home(cluster, model) for model in MODELS}
    added = cluster.add_node()
    deadline = time.monotonic() + 30
    after = before
    while time.monotonic() < deadline:
        after = {model: _home(cluster, model) for model in MODELS}
        if added.name in after.values():
            break
        time.sleep(0.1)
    moved = {model for model in MODELS if after[model] != before[model]}
    assert moved and all(after[model] == added.name for model in moved), (before, after)
    assert _infer_grpc(_grpc(cluster), next(iter(moved))).shape == (1, 4)


def _serval(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serval", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_cluster_command_up_status_add_remove_and_stop(repository: Path) -> None:
    port = free_port()
    up = subprocess.Popen(
        [sys.executable, "-m", "serval", "cluster", "up", "-r", str(repository), "--nodes", "3",
         "--http-port", str(port), "--grpc-port", "0", "--", "--max-inflight", "512"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ})
    try:
        assert up.stdout is not None
        banner = up.stdout.readline()
        assert f"3 nodes behind http://127.0.0.1:{port}/v2" in banner, banner
        _infer_http(httpclient.InferenceServerClient(f"127.0.0.1:{port}"), "m0")
        status = _serval("cluster", "status", "--http-port", str(port), "--json")
        assert status.returncode == 0, status.stderr
        nodes = orjson.loads(status.stdout)
        assert [n["name"] for n in nodes] == ["node1", "node2", "node3"]
        assert all(n["health"].startswith("UP") and n["pid"] for n in nodes)
        added = _serval("cluster", "add-node", "--http-port", str(port))
        assert added.returncode == 0 and "added node4" in added.stdout, added.stderr
        removed = _serval("cluster", "remove-node", "node2", "--http-port", str(port))
        assert removed.returncode == 0, removed.stderr
        unknown = _serval("cluster", "remove-node", "node9", "--http-port", str(port))
        assert unknown.returncode == 1 and "no node named node9" in unknown.stderr
        status = _serval("cluster", "status", "--http-port", str(port), "--json")
        assert [n["name"] for n in orjson.loads(status.stdout)] == ["node1", "node3", "node4"]
        table = _serval("cluster", "status", "--http-port", str(port))
        assert all(len(line) <= 80 for line in table.stdout.splitlines()), table.stdout
    finally:
        up.send_signal(signal.SIGTERM)
        out, _ = up.communicate(timeout=90)
    assert up.returncode == 0, out
    again = _serval("cluster", "status", "--http-port", str(port))
    assert again.returncode == 1 and "no local cluster" in again.stderr


@pytest.mark.parametrize(("args", "reason"), [
    (["up", "-r", "{repo}", "--node-cpus", "-1"], "--node-cpus must be > 0"),
    (["up", "-r", "{repo}", "--balance-factor", "50"], "balance factor must be > 100"),
    (["up", "-r", "/no/such/folder"], "is not a folder"),
    (["proxy-config", "--node", "10.0.0.1"], "expected [NAME=]HOST:HTTP"),
    (["proxy-config", "--node", "10.0.0.1:8000", "--proxy-buffer-kib", "4"],
     "the proxy's buffer must be 8-1024 KiB"),
    (["proxy-config"], "give either --node"),
    (["status", "--http-port", "1"], "no local cluster runs"),
    (["add-node", "--http-port", "1"], "no local cluster runs"),
])
def test_bad_cluster_commands_exit_with_one_line(repository: Path, args: list[str],
                                                 reason: str) -> None:
    done = _serval("cluster", *(a.replace("{repo}", str(repository)) for a in args))
    assert done.returncode != 0
    assert reason in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "/no/such" not in done.stderr
