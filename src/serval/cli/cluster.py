"""`serval cluster`: Serval nodes behind HAProxy (bounded-load consistent hashing on the model
name): a local cluster in the foreground, the proxy's configuration for nodes elsewhere, the
cluster's status and its membership; `serval cluster ray ...` is the Ray Serve path."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from serval.cli import ray
from serval.cli.command import ServalCommand, ServalGroup, fail
from serval.cli.tables import FORMAT, Column, OutputFormat, Rows, cell, emit
from serval.cluster import control
from serval.cluster.haproxy import Discovery, Node, ProxySettings, render
from serval.cluster.local import ClusterSpec, LocalCluster, read_state, run_dir_for
from serval.cluster.proxy import RuntimeApi
from serval.cluster.status import NodeStatus, cluster_status
from serval.errors import ConfigError

app = typer.Typer(cls=ServalGroup, no_args_is_help=True,
                  help="Scale out: Serval nodes behind HAProxy, routed by model name.")
app.add_typer(ray.app, name="ray")

_PROXY = ProxySettings()
HTTP_PORT = typer.Option(_PROXY.http_port, "--http-port", help="The proxy's HTTP port.")
HOT_RATE = typer.Option(_PROXY.hot_rate, "--hot-rate",
                        help="Requests/s that make a model hot: it spreads over nodes.")
BALANCE = typer.Option(_PROXY.balance_factor, "--balance-factor",
                       help="A hot model's node takes at most this % of the average load.")
THREADS = typer.Option(_PROXY.threads, "--proxy-threads", help="HAProxy's threads.")
BUFFER = typer.Option(_PROXY.buffer_kib, "--proxy-buffer-kib",
                      help="HAProxy's buffer per request: requests that fit are retried on "
                      "another node; it also bounds request headers.")


@app.command("up", cls=ServalCommand, context_settings={
    "allow_extra_args": True, "ignore_unknown_options": True})
def up_command(
    ctx: typer.Context,
    repository: Path = typer.Option(..., "--repository", "-r",
                                    help="Model repository every node serves (lazily)."),
    nodes: int = typer.Option(3, "--nodes", "-n", min=1, max=64, help="Node processes."),
    host: str = typer.Option(_PROXY.host, help="Address the proxy listens on."),
    http_port: int = HTTP_PORT,
    grpc_port: int = typer.Option(8001, "--grpc-port", help="The proxy's gRPC port; 0: none."),
    node_cpus: float = typer.Option(None, "--node-cpus",
                                    help="CPU quota per node (a cgroup), e.g. 0.5; default: "
                                    "the cores split among the nodes."),
    hot_rate: int = HOT_RATE,
    balance_factor: int = BALANCE,
    proxy_threads: int = THREADS,
    proxy_buffer_kib: int = BUFFER,
) -> None:
    """Run N nodes and the proxy in the foreground; Ctrl-C or SIGTERM drains and stops all.

    Flags after `--` go to every node's `serval serve` (e.g. -- --memory-budget 2GiB)."""
    if not repository.is_dir():
        fail(f"repository {repository.name!r} is not a folder", 2)
    try:
        spec = ClusterSpec(
            repository.resolve(), nodes, host, http_port, grpc_port or None, node_cpus,
            tuple(a for a in ctx.args if a != "--"),
            ProxySettings(hot_rate=hot_rate, balance_factor=balance_factor,
                          threads=proxy_threads, buffer_kib=proxy_buffer_kib))
    except ValueError as exc:
        fail(str(exc), 2)
    if read_state(http_port) is not None:
        fail(f"a cluster already runs with its proxy on port {http_port}", 1)
    try:
        cluster = LocalCluster(spec)
    except ConfigError as exc:
        fail(str(exc), 2)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    wake = threading.Event()
    signal.signal(signal.SIGHUP, lambda *_: wake.set())
    try:
        cluster.start()
    except ConfigError as exc:
        fail(str(exc), 1)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    typer.echo(f"serval cluster: {nodes} nodes behind http://{shown}:{http_port}/v2"
               + (f" and gRPC {shown}:{grpc_port}" if grpc_port else ""))
    for node in cluster.nodes:
        typer.echo(f"  {node.node.name}: pid {node.pid}, http {node.node.http_port}, cores "
                   f"{','.join(map(str, node.share.cores)) if node.share else 'all'}")
    typer.echo(f"  state and logs: {cluster.run_dir}")
    try:
        while not stop.is_set():
            if wake.wait(0.5):
                wake.clear()
                _serve_requests(cluster)
            for event in cluster.watch():
                typer.echo(f"serval cluster: {event}")
    finally:
        typer.echo("serval cluster: draining and stopping")
        cluster.stop()


def _serve_requests(cluster: LocalCluster) -> None:
    for path, request in control.pending(cluster.run_dir):
        try:
            if request.get("op") == "add":
                node = cluster.add_node(request.get("address"))
                reply: dict[str, Any] = {"ok": True, "name": node.name,
                                         "http": f"{node.host}:{node.http_port}"}
            elif request.get("op") == "remove":
                cluster.remove_node(str(request.get("name")))
                reply = {"ok": True, "name": request.get("name")}
            else:
                reply = {"ok": False, "error": f"unknown request {request.get('op')!r}"}
        except ConfigError as exc:
            reply = {"ok": False, "error": str(exc)}
        control.answer(path, reply)
        if reply["ok"]:
            typer.echo(f"serval cluster: {request['op']} {reply['name']}: done")


def _ask(http_port: int, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Hand a membership request to the `up` process on this port; its reply, or exit 1."""
    state = read_state(http_port)
    if state is None:
        fail(f"no local cluster runs with its proxy on port {http_port} "
             "(start one with: serval cluster up)", 1)
    reply = control.submit(run_dir_for(http_port), int(str(state["pid"])), request, timeout_s)
    if not reply.get("ok"):
        fail(str(reply.get("error")), 1)
    return reply


@app.command("add-node", cls=ServalCommand)
def add_node_command(
    http_port: int = HTTP_PORT,
    address: str = typer.Option(None, "--address",
                                help="[NAME=]HOST:HTTP[:GRPC[:AGENT]] of a node started "
                                "elsewhere; default: start one more local node."),
) -> None:
    """Add a node to a running local cluster; the proxy reloads without dropping a
    connection."""
    reply = _ask(http_port, {"op": "add", "address": address}, timeout_s=180)
    typer.echo(f"added {reply['name']} ({reply['http']})")


@app.command("remove-node", cls=ServalCommand)
def remove_node_command(
    name: str = typer.Argument(..., help="The node's name (see serval cluster status)."),
    http_port: int = HTTP_PORT,
) -> None:
    """Take a node out: the proxy stops sending to it, then a local node drains and exits."""
    _ask(http_port, {"op": "remove", "name": name}, timeout_s=120)
    typer.echo(f"removed {name}")


@app.command("proxy-config", cls=ServalCommand)
def proxy_config_command(
    node: list[str] = typer.Option(None, "--node",
                                   help="[NAME=]HOST:HTTP[:GRPC[:AGENT]]; repeat per node, "
                                   "in a fixed order (a node's place fixes its ring id)."),
    dns: str = typer.Option(None, "--dns", help="A DNS name resolving to every node (e.g. a "
                            "Kubernetes headless Service) instead of --node."),
    slots: int = typer.Option(16, "--slots", help="With --dns: the most nodes."),
    statefulset: str = typer.Option(None, "--statefulset",
                                    help="With --dns: the nodes are this StatefulSet's pods "
                                    "(one server per pod, a fixed ring id each: every proxy "
                                    "hashes alike)."),
    node_http_port: int = typer.Option(8000, "--node-http-port", help="With --dns."),
    node_grpc_port: int = typer.Option(8001, "--node-grpc-port", help="With --dns; 0: none."),
    node_agent_port: int = typer.Option(8002, "--node-agent-port", help="With --dns; 0: none."),
    host: str = typer.Option("0.0.0.0", help="Address the proxy listens on."),
    http_port: int = HTTP_PORT,
    grpc_port: int = typer.Option(8001, "--grpc-port", help="The proxy's gRPC port; 0: none."),
    stats_socket: str = typer.Option(None, "--stats-socket",
                                     help="Runtime API socket path (for cluster status)."),
    stats_port: int = typer.Option(None, "--stats-port",
                                   help="HAProxy's stats page and Prometheus /metrics."),
    hot_rate: int = HOT_RATE,
    balance_factor: int = BALANCE,
    proxy_threads: int = THREADS,
    proxy_buffer_kib: int = BUFFER,
    output: Path = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
) -> None:
    """Print the HAProxy configuration for a node list or a DNS name."""
    if bool(node) == bool(dns):
        fail("give either --node (one per node) or --dns", 2)
    if statefulset and not dns:
        fail("--statefulset needs --dns (the pods' headless Service)", 2)
    try:
        settings = ProxySettings(host=host, http_port=http_port, grpc_port=grpc_port or None,
                                 stats_socket=stats_socket, stats_port=stats_port,
                                 hot_rate=hot_rate, balance_factor=balance_factor,
                                 threads=proxy_threads, buffer_kib=proxy_buffer_kib)
        nodes: list[Node] | Discovery = (
            [Node.parse(spec, index + 1) for index, spec in enumerate(node)] if node else
            Discovery(dns, slots, node_http_port, node_grpc_port or None,
                      node_agent_port or None, statefulset=statefulset))
        text = render(settings, nodes)
    except ValueError as exc:
        fail(str(exc), 2)
    if output is None:
        typer.echo(text, nl=False)
    else:
        try:
            output.write_text(text)
        except OSError as exc:
            fail(f"cannot write the configuration to {output}: {exc.strerror or exc}", 1)
        typer.echo(f"wrote {output}")


@app.command("status", cls=ServalCommand)
def status_command(
    http_port: int = HTTP_PORT,
    stats_socket: str = typer.Option(None, "--stats-socket",
                                     help="The proxy's runtime API socket (default: the local "
                                     "cluster's on --http-port)."),
    token: str = typer.Option(None, "--token", envvar="SERVAL_TOKEN",
                              help="Bearer token for the nodes' /status (auth on)."),
    json_output: bool = typer.Option(False, "--json", help="Same as --format json."),
    output: OutputFormat = FORMAT,
) -> None:
    """Per node: address, pid, health, load, requests, resident models, hit rate."""
    pids: dict[str, int | None] = {}
    if stats_socket is None:
        state = read_state(http_port)
        if state is None:
            fail(f"no local cluster runs with its proxy on port {http_port}; give "
                 "--stats-socket for a proxy elsewhere", 1)
        stats_socket = str(state["stats_socket"])
        pids = {n["name"]: n["pid"] for n in state["nodes"]}
    try:
        nodes = cluster_status(RuntimeApi(stats_socket), pids, token)
    except OSError as exc:
        fail(f"cannot reach the proxy's runtime API: {exc.strerror or exc}", 1)
    output = OutputFormat.json if json_output else output
    if output is OutputFormat.table:  # 80 columns: errors fold into health; pids in --json
        rows = Rows([Column("node", "node"), Column("address", "address"),
                     Column("health", "health"), Column("requests", "requests", True),
                     Column("hot", "hot", True), Column("resident_models", "models", True),
                     Column("hit_rate", "hit rate", True)],
                    title=f"cluster behind port {http_port}",
                    caption="hot: requests for models busy enough to spread over nodes")
        for n in nodes:
            health = n.health + (f" ({n.errors:,} errors)" if n.errors else "")
            rows.add(cell(n.name), cell(n.address), cell(health), cell(n.requests, "{:,}"),
                     cell(n.hot, "{:,}"), cell(n.resident_models, "{:,}"),
                     cell(n.hit_rate, "{:.1%}"))
    else:
        rows = Rows([Column(key, key) for key in NodeStatus.__dataclass_fields__])
        for n in nodes:
            rows.add(*(cell(getattr(n, key)) for key in NodeStatus.__dataclass_fields__))
    emit(rows, output, Console())
