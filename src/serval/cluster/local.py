"""A cluster on one machine: N `serval serve` node processes, each on its own share of the
cores, behind one HAProxy (`serval cluster up`, the benchmarks and the tests build it here).

The cluster's state (nodes, ports, pids, the proxy's files) lives in a run folder, so
`serval cluster status` and `add-node`/`remove-node` find it from the proxy's HTTP port."""

from __future__ import annotations

import contextlib
import errno
import http.client
import json
import logging
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from serval.cluster.cpu import CpuShare, plan_shares
from serval.cluster.haproxy import Node, ProxySettings, render
from serval.cluster.proxy import HaproxyProcess, RuntimeApi
from serval.errors import ConfigError
from serval.ports import free_ports

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 120.0
NODE_STOP_GRACE_S = 40.0
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 10.0)


def run_dir_for(http_port: int) -> Path:
    """Where a local cluster whose proxy listens on `http_port` keeps its state."""
    return Path(tempfile.gettempdir()) / f"serval-cluster-{http_port}"


def private_folder(path: Path) -> Path:
    """PATH made (0700) or checked: ours and not writable by others. The run folder holds the
    proxy's admin socket and the membership requests the `up` process acts on, at a name anyone
    on the machine can predict."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise ConfigError(f"the cluster's run folder {path} is not a private folder of this "
                          "user (another user's, a link, or writable by others): remove it")
    return path


@dataclass
class LocalNode:
    """One node process and what the proxy needs to reach it."""

    node: Node
    share: CpuShare | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    restarts: int = 0
    died_at: float | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass(frozen=True)
class ClusterSpec:
    """What `serval cluster up` was asked for."""

    repository: Path
    nodes: int = 3
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int | None = 8001
    node_cpus: float | None = None  # a CPU quota per node (cgroup); None: a share of cores
    node_args: tuple[str, ...] = ()  # more `serve` flags for every node
    proxy: ProxySettings = field(default_factory=ProxySettings)
    restart: bool = True  # restart a node that died unasked
    run_dir: Path | None = None

    def __post_init__(self) -> None:
        """The proxy's settings with this spec's host and ports, checked now (ValueError),
        before any folder, node or proxy exists."""
        self.settings(self.run_dir)

    def settings(self, run_dir: Path | None) -> ProxySettings:
        """The proxy's settings: PROXY with the spec's host and ports, its runtime API socket
        in RUN_DIR."""
        return ProxySettings(**{
            **asdict(self.proxy), "host": self.host, "http_port": self.http_port,
            "grpc_port": self.grpc_port,
            "stats_socket": str(run_dir / "haproxy.sock") if run_dir else None})


class LocalCluster:
    """Starts, watches, grows, shrinks and stops the nodes and the proxy."""

    def __init__(self, spec: ClusterSpec) -> None:
        if spec.nodes < 1:
            raise ConfigError("a cluster needs at least one node")
        if spec.node_cpus is not None and spec.node_cpus <= 0:
            raise ConfigError(f"--node-cpus must be > 0 (got {spec.node_cpus})")
        self.spec = spec
        self.run_dir = private_folder(spec.run_dir or run_dir_for(spec.http_port))
        self.nodes: list[LocalNode] = []
        self.remote: list[Node] = []
        self.settings = spec.settings(self.run_dir)
        self.proxy = HaproxyProcess(self.run_dir / "haproxy.cfg", self.run_dir / "haproxy.log")
        self.api = RuntimeApi(self.run_dir / "haproxy.sock")
        self._next_id = 1

    # lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Every node ready, then the proxy listening; ConfigError/OSError if one cannot."""
        for port in (self.spec.http_port, self.spec.grpc_port):
            problem = _bind_problem(self.spec.host, port) if port else None
            if problem:
                raise ConfigError(problem)
        shares = plan_shares(self.spec.nodes, self.spec.node_cpus, self.run_dir.name)
        try:
            for share in shares:
                self.nodes.append(self._spawn(self._new_node(), share))
            for node in self.nodes:
                self._wait_ready(node)
            self._write_config()
            self.proxy.start(preexec=die_with_parent)
            if not self.api.wait_ready(30.0) or not self.proxy.alive():
                raise ConfigError(f"HAProxy did not start: {_tail(self.proxy.log)}")
            self._save_state()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """The proxy stops listening and finishes its requests; then every node drains."""
        self.proxy.stop()
        for node in self.nodes:
            if node.alive():
                assert node.process is not None
                node.process.send_signal(signal.SIGTERM)
        for node in self.nodes:
            self._reap(node)
        (self.run_dir / "state.json").unlink(missing_ok=True)
        if not self.proxy.alive():  # HAProxy leaves its runtime API's socket file behind
            (self.run_dir / "haproxy.sock").unlink(missing_ok=True)

    def watch(self) -> list[str]:
        """One supervision pass: restart nodes that died unasked (with a backoff); returns
        what happened, for the log."""
        events = []
        now = time.monotonic()
        for node in self.nodes:
            if node.alive() or not self.spec.restart:
                continue
            if node.died_at is None:
                node.died_at = now
                code = node.process.returncode if node.process else None
                events.append(f"{node.node.name} exited ({code}); the proxy routes around it")
            backoff = RESTART_BACKOFF_S[min(node.restarts, len(RESTART_BACKOFF_S) - 1)]
            if now - node.died_at >= backoff:
                node.restarts += 1
                node.died_at = None
                self._spawn(node, node.share)
                events.append(f"{node.node.name} restarted (pid {node.pid})")
                self._save_state()
        return events

    # membership ---------------------------------------------------------------------------

    def add_node(self, address: str | None = None) -> Node:
        """A new local node (ready before the proxy sees it), or a remote one by address
        (`[NAME=]HOST:HTTP[:GRPC[:AGENT]]`); the proxy reloads without dropping a connection."""
        if address is not None:
            try:
                node = Node.parse(address, self._take_id())
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
            if node.name in self.names():
                raise ConfigError(f"a node named {node.name} is already in the cluster")
            self.remote.append(node)
        else:
            share = plan_shares(len(self.nodes) + 1, self.spec.node_cpus,
                                self.run_dir.name)[-1]
            local = self._spawn(self._new_node(), share)
            self.nodes.append(local)
            self._wait_ready(local)
            node = local.node
        self._reload()
        return node

    def remove_node(self, name: str) -> None:
        """The proxy stops sending to it (reload), then a local node drains and exits."""
        local = next((n for n in self.nodes if n.node.name == name), None)
        remote = next((n for n in self.remote if n.name == name), None)
        if local is None and remote is None:
            raise ConfigError(f"no node named {name} (nodes: {', '.join(self.names())})")
        if len(self.names()) == 1:
            raise ConfigError("cannot remove the last node")
        if local is not None:
            self.nodes.remove(local)
        if remote is not None:
            self.remote.remove(remote)
        self._reload()
        if local is not None and local.alive():
            assert local.process is not None
            local.process.send_signal(signal.SIGTERM)
            self._reap(local)

    def restart_node(self, name: str) -> LocalNode:
        """Start a local node that exited (killed, crashed) again on its own ports, id and CPU
        share; returns once it is ready (the proxy's health check then brings it back)."""
        local = next((n for n in self.nodes if n.node.name == name), None)
        if local is None:
            raise ConfigError(f"no local node named {name} (nodes: {', '.join(self.names())})")
        if local.alive():
            raise ConfigError(f"{name} is running (pid {local.pid})")
        if local.process is not None:
            local.process.wait()  # reap it
        local.restarts += 1
        local.died_at = None
        self._spawn(local, local.share)
        self._wait_ready(local)
        self._save_state()
        return local

    def names(self) -> list[str]:
        return [n.node.name for n in self.nodes] + [n.name for n in self.remote]

    def node(self, name: str) -> LocalNode:
        return next(n for n in self.nodes if n.node.name == name)

    # internals ----------------------------------------------------------------------------

    def _take_id(self) -> int:
        taken = {n.node.id for n in self.nodes} | {n.id for n in self.remote}
        while self._next_id in taken:
            self._next_id += 1
        self._next_id += 1
        return self._next_id - 1

    def _new_node(self) -> LocalNode:
        node_id = self._take_id()
        host = self.spec.host if self.spec.host not in ("0.0.0.0", "::") else "127.0.0.1"
        if self.spec.grpc_port is None:
            (http, agent), grpc = free_ports(2, host), None
        else:
            http, agent, grpc = free_ports(3, host)
        return LocalNode(Node(f"node{node_id}", host, http, grpc, agent, node_id))

    def _spawn(self, local: LocalNode, share: CpuShare | None) -> LocalNode:
        node = local.node
        command = [sys.executable, "-m", "serval", "serve",
                   "--repository", str(self.spec.repository), "--host", node.host,
                   "--http-port", str(node.http_port),
                   "--grpc-port", str(node.grpc_port or 0),
                   "--agent-port", str(node.agent_port), "--node-name", node.name,
                   "--model-control", "lazy", "--drain-delay-s",
                   str(2 * self.settings.check_interval_ms / 1000),
                   *self.spec.node_args]
        with open(self.run_dir / f"{node.name}.log", "ab") as out:
            local.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=lambda: _child_setup(share))
        local.share = share
        return local

    def _wait_ready(self, local: LocalNode) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if not local.alive():
                tail = _tail(self.run_dir / f"{local.node.name}.log")
                raise ConfigError(f"{local.node.name} exited before it was ready: {tail}")
            if _ready(local.node.host, local.node.http_port):
                return
            time.sleep(0.05)
        raise ConfigError(f"{local.node.name} was not ready within {READY_TIMEOUT_S:.0f} s")

    def _write_config(self) -> None:
        text = render(self.settings, [n.node for n in self.nodes] + self.remote)
        path = self.run_dir / "haproxy.cfg"
        temporary = path.with_suffix(".new")
        temporary.write_text(text)
        os.replace(temporary, path)

    def _reload(self) -> None:
        self._write_config()
        self.proxy.reload()
        self._save_state()

    def _reap(self, local: LocalNode) -> None:
        if local.process is None:
            return
        try:
            local.process.wait(timeout=NODE_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            local.process.kill()
            local.process.wait()
        if local.share is not None:
            local.share.release()

    def _save_state(self) -> None:
        state = {
            "pid": os.getpid(), "proxy_pid": self.proxy.pid,
            "http_port": self.spec.http_port, "grpc_port": self.spec.grpc_port,
            "stats_socket": self.settings.stats_socket,
            "nodes": [{**asdict(n.node), "pid": n.pid, "local": True} for n in self.nodes]
            + [{**asdict(n), "pid": None, "local": False} for n in self.remote],
        }
        temporary = self.run_dir / "state.json.new"
        temporary.write_text(json.dumps(state, indent=1))
        os.replace(temporary, self.run_dir / "state.json")


def read_state(http_port: int) -> dict[str, object] | None:
    """The state a running `serval cluster up` on this port saved; None when there is none."""
    path = run_dir_for(http_port) / "state.json"
    with contextlib.suppress(OSError, ValueError):
        state = json.loads(path.read_text())
        pid = state.get("pid")
        if isinstance(pid, int) and _pid_alive(pid):
            return dict(state)
    return None


def die_with_parent() -> None:
    """In a child before exec: SIGTERM it when the process that started it dies (a `cluster
    up` killed with -9 leaves no node or proxy behind). Linux only; elsewhere a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _child_setup(share: CpuShare | None) -> None:
    die_with_parent()
    if share is not None:
        share.enter()


def _bind_problem(host: str, port: int) -> str | None:
    """Why the proxy could not listen on host:port (in use, not this machine's address, a
    name that does not resolve, a port that needs privileges); None when it can."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except socket.gaierror:
            return f"--host {host!r} does not resolve to an address of this machine"
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"the proxy's port {port} is in use on {host}"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"--host {host} is not an address of this machine (give one of its " \
                       "addresses, 127.0.0.1 or 0.0.0.0)"
            if exc.errno == errno.EACCES:
                return f"the proxy may not listen on port {port} (ports below 1024 need " \
                       "privileges); give a port from 1024"
            return f"the proxy cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ready(host: str, port: int) -> bool:
    try:
        connection = http.client.HTTPConnection(host, port, timeout=2)
        connection.request("GET", "/v2/health/ready")
        ok = connection.getresponse().status == 200
        connection.close()
        return ok
    except OSError:
        return False


def _tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else "(no output)"
    return "(no log)"
