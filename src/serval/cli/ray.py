"""`serval cluster ray`: deploy Serval onto a Ray cluster (Ray Serve), show it, remove it."""

from __future__ import annotations

import logging
import socket
from typing import Any

import typer

from serval.cli.command import ServalCommand, ServalGroup, fail
from serval.cli.duration import seconds
from serval.cluster.config import ClusterConfig
from serval.config import MIB, TransportLimits
from serval.errors import ConfigError

app = typer.Typer(cls=ServalGroup, no_args_is_help=True,
                  help="The Ray Serve path: one Serval application across a Ray cluster.")
ADDRESS = typer.Option(..., "--address", "-a",
                       help="Ray cluster address (HOST:6379, ray://HOST:10001 or 'auto').")
NAME = typer.Option("serval", "--name", help="Ray Serve application name.")


def _default(name: str) -> Any:
    """ClusterConfig's default for a setting (written once, there)."""
    return ClusterConfig.model_fields[name].default


@app.command("deploy", cls=ServalCommand)
def deploy_command(
    address: str = ADDRESS,
    repository: str = typer.Option(..., "--repository", "-r",
                                   help="Path every node sees, or an fsspec URL (s3://...)."),
    memory_budget: str = typer.Option(None, "--memory-budget",
                                      help="Per replica, e.g. 4GiB: LRU eviction beyond it."),
    replicas: int = typer.Option(None, "--replicas", help="Fixed replica count (no autoscaling)."),
    min_replicas: int = typer.Option(_default("min_replicas"), "--min-replicas"),
    max_replicas: int = typer.Option(_default("max_replicas"), "--max-replicas"),
    target_ongoing_requests: float = typer.Option(
        _default("target_ongoing_requests"), "--target-ongoing-requests",
        help="Autoscaling target per replica."),
    replica_cpus: float = typer.Option(_default("replica_cpus"), "--replica-cpus",
                                       help="CPUs per replica."),
    poll_interval_s: float = typer.Option(
        _default("poll_interval_s"), "--poll-interval-s", parser=seconds, metavar="DURATION",
        help="Repository polling (publish/rollback)."),
    auth_tokens: str = typer.Option(
        None, "--auth-tokens", help="Tokens file every node sees: require bearer tokens."),
    max_inflight: int = typer.Option(_default("max_inflight"), "--max-inflight",
                                     help="Per replica, as serve's --max-inflight."),
    default_timeout_ms: float = typer.Option(_default("default_timeout_ms"),
                                             "--default-timeout-ms",
                                             help="As serve's --default-timeout-ms."),
    metrics_top_k: int = typer.Option(_default("metrics_top_k"), "--metrics-top-k",
                                      help="As serve's --metrics-top-k."),
    max_request_mb: float = typer.Option(TransportLimits.max_request_bytes / MIB,
                                         "--max-request-mb",
                                         help="As serve's --max-request-mb."),
    host: str = typer.Option("0.0.0.0", help="Address Ray's HTTP proxies listen on."),
    http_port: int = typer.Option(8000, "--http-port", help="Ray Serve's HTTP port."),
    name: str = NAME,
) -> None:
    """Deploy (or update) the Serval application; returns once every replica is up."""
    args: dict[str, Any] = {
        "repository": repository, "memory_budget": memory_budget, "num_replicas": replicas,
        "min_replicas": min_replicas, "max_replicas": max_replicas,
        "target_ongoing_requests": target_ongoing_requests, "replica_cpus": replica_cpus,
        "poll_interval_s": poll_interval_s, "auth_tokens": auth_tokens,
        "max_inflight": max_inflight, "default_timeout_ms": default_timeout_ms,
        "metrics_top_k": metrics_top_k,
        "limits": {"max_request_bytes": int(max_request_mb * MIB)},
    }
    try:
        config = ClusterConfig.parse({k: v for k, v in args.items() if v is not None})
    except ConfigError as exc:
        fail(str(exc), 1)
    serve = _connect(address)
    from serval.cluster.ray import build_app

    serve.start(http_options={"host": host, "port": http_port})
    serve.run(build_app(config.model_dump(mode="json", exclude_none=True)), name=name,
              route_prefix="/")
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    typer.echo(f"serval deployed as Ray Serve application '{name}': http://{shown}:{http_port}/v2")


@app.command("status", cls=ServalCommand)
def status_command(address: str = ADDRESS, name: str = NAME) -> None:
    """The application's state and its deployments' replica counts."""
    serve = _connect(address)
    application = serve.status().applications.get(name)
    if application is None:
        fail(f"no Ray Serve application named '{name}' on {address}", 1)
    typer.echo(f"{name}: {_word(application.status)}")
    for deployment, status in application.deployments.items():
        states = ", ".join(f"{n} {_word(s).lower()}"
                           for s, n in sorted(status.replica_states.items()))
        typer.echo(f"  {deployment}: {_word(status.status)} ({states})")


@app.command("delete", cls=ServalCommand)
def delete_command(address: str = ADDRESS, name: str = NAME) -> None:
    """Remove the application (its replicas finish in-flight requests first)."""
    serve = _connect(address)
    serve.delete(name)
    typer.echo(f"deleted Ray Serve application '{name}'")


def _word(state: Any) -> str:
    """An enum member's value ('RUNNING'), or the string itself."""
    return str(getattr(state, "value", state))


def _connect(address: str) -> Any:
    try:
        import ray
        from ray import serve
    except ImportError:
        fail("Ray Serve is not installed: pip install 'serval-server[ray]'", 1)
    _reachable(address)
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        fail(f"cannot connect to the Ray cluster at {address}: {str(exc).splitlines()[0]}", 1)
    return serve


def _reachable(address: str) -> None:
    """Fail fast on a HOST:PORT nobody listens on (ray.init would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # 'auto' and the like: Ray resolves them
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        fail(f"cannot connect to the Ray cluster at {address}: {exc}", 1)
