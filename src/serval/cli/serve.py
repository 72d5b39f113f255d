"""`serval serve`: serve a model repository over KServe v2 HTTP."""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import ValidationError

from serval.config import ServerConfig
from serval.errors import ConfigError


def serve_command(
    repository: Path = typer.Option(..., "--repository", "-r", help="Model repository folder."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    http_port: int = typer.Option(8000, "--http-port", help="HTTP port (KServe v2 REST)."),
    grpc_port: int = typer.Option(8001, "--grpc-port", help="gRPC port (KServe v2); 0 disables."),
    grpc_max_message_mb: int = typer.Option(
        256, "--grpc-max-message-mb", help="Largest gRPC message accepted or sent, in MiB."
    ),
    model_control: str = typer.Option(
        "all", "--model-control",
        help="all: load every model at start; lazy: on first request; explicit: via the API.",
    ),
    memory_budget: str = typer.Option(
        None, "--memory-budget", help="e.g. 2GiB: evict idle least-recently-used models beyond."
    ),
    max_concurrent_loads: int = typer.Option(2, "--max-concurrent-loads"),
    allow_python_models: bool = typer.Option(
        False, "--allow-python-models", help="Serve Python models (model.py runs arbitrary code)."
    ),
    auth_tokens: Path = typer.Option(
        None, "--auth-tokens", help="Tokens file (serval token create): require bearer tokens."
    ),
    tls_cert: Path = typer.Option(None, "--tls-cert", help="PEM certificate (HTTPS, gRPC TLS)."),
    tls_key: Path = typer.Option(None, "--tls-key", help="PEM private key for --tls-cert."),
    max_inflight: int = typer.Option(
        4096, "--max-inflight", help="Requests in the server at once; beyond, 429 at once."
    ),
    default_timeout_ms: float = typer.Option(
        0.0, "--default-timeout-ms", help="Deadline for requests that set none (0: none)."
    ),
    metrics_top_k: int = typer.Option(
        100, "--metrics-top-k", help="Per-model metric series for the K busiest; others summed."
    ),
    poll_interval_s: float = typer.Option(
        0.0, "--poll-interval-s",
        help="Watch the repository: publishes, rollbacks and config edits hot-swap (0: off).",
    ),
    workers: int = typer.Option(
        1, help="Serving processes sharing the port (SO_REUSEPORT); each loads every model."
    ),
    log_level: str = typer.Option("info", help="debug, info, warning or error."),
    repository_api: bool = typer.Option(
        None, "--repository-api/--no-repository-api",
        help="Allow model load/unload over the API (default: on with --model-control "
        "explicit or lazy, off with all).",
    ),
    max_request_mb: float = typer.Option(
        256.0, "--max-request-mb", help="Largest HTTP request body (inflated too); beyond: 413."
    ),
    max_tensor_elements: int = typer.Option(
        64 * 1024 * 1024, "--max-tensor-elements",
        help="Most elements in one input tensor; beyond: 400.",
    ),
) -> None:
    """Serve every model in REPOSITORY over KServe v2 REST and gRPC."""
    from serval.server.runner import serve

    try:
        config = ServerConfig(
            repository=repository, host=host, http_port=http_port, grpc_port=grpc_port,
            grpc_max_message_mb=grpc_max_message_mb, workers=workers,
            model_control=model_control, memory_budget=memory_budget,
            max_concurrent_loads=max_concurrent_loads, poll_interval_s=poll_interval_s,
            metrics_top_k=metrics_top_k, allow_python_models=allow_python_models,
            max_inflight=max_inflight, default_timeout_ms=default_timeout_ms,
            auth_tokens=auth_tokens, tls_cert=tls_cert, tls_key=tls_key,
            log_level=log_level, repository_api=repository_api,
            max_request_mb=max_request_mb, max_tensor_elements=max_tensor_elements,
        )
    except ValidationError as exc:
        raise typer.BadParameter(_one_line(exc)) from None
    if not repository.is_dir():
        _fail(f"model repository '{repository}' is not a directory")
    if workers > 1 and http_port == 0:
        _fail("--workers > 1 needs a fixed --http-port (the workers share it)")
    if grpc_port and grpc_port == http_port:
        _fail(f"--grpc-port and --http-port are both {grpc_port}")
    try:
        serve(config)
    except ConfigError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(str(exc) if exc.strerror is None else
              f"cannot listen on {host}:{http_port}: {exc.strerror}")


def _one_line(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"


def _fail(message: str) -> None:
    typer.echo(f"serval: {message}", err=True)
    raise typer.Exit(2)
