"""`serval serve`: serve a model repository over KServe v2 HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from serval.cli.command import fail
from serval.cli.duration import milliseconds, seconds
from serval.config import MIB, LimitError, ServerConfig, TransportLimits, server_default
from serval.errors import ConfigError, ServalError

KIB = 1024
_BALANCER = "Behind a load balancer"
_DEFAULT_LIMITS = TransportLimits()
# the limits whose flag takes another unit than the field
_LIMIT_FLAGS = {"receive_budget_bytes": "--receive-budget-mb",
                "max_request_bytes": "--max-request-mb", "write_buffer_bytes": "--write-buffer-kb",
                "max_message_bytes": "--grpc-max-message-mb",
                "h2_stream_window_bytes": "--h2-stream-window-kb",
                "h2_connection_window_bytes": "--h2-connection-window-mb"}


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _limit(field: str, help_text: str, unit: int = 1) -> Any:
    """A limit's flag: its default from TransportLimits (in the flag's unit), in its own panel;
    a timeout (`_s`) takes a duration."""
    default = getattr(_DEFAULT_LIMITS, field)
    if unit != 1:
        default = default / unit
    parser = seconds if field.endswith("_s") else None
    return typer.Option(default, help=help_text, rich_help_panel="Limits and timeouts",
                        parser=parser, metavar="DURATION" if parser else None)



def serve_command(
    repository: Path = typer.Option(
        None, "--repository", "-r", show_default=False,
        help="Model repository folder (required; Triton's --model-repository works too)."),
    host: str = typer.Option(server_default("host"), help="Address to listen on."),
    http_port: int = typer.Option(server_default("http_port"), "--http-port",
                                  help="HTTP port (KServe v2 REST)."),
    grpc_port: int = typer.Option(server_default("grpc_port"), "--grpc-port",
                                  help="gRPC port (KServe v2); 0 disables."),
    model_control: str = typer.Option(
        server_default("model_control"), "--model-control",
        help="all: load every model at start; lazy: on first request; explicit: via the API "
        "(Triton's --model-control-mode none|poll|explicit works too).",
    ),
    load_models: list[str] = typer.Option(
        None, "--load-model", metavar="NAME",
        help="With --model-control explicit: load this model at start (repeatable; * = all), "
        "as Triton's flag."),
    memory_budget: str = typer.Option(
        None, "--memory-budget", help="e.g. 2GiB: evict idle least-recently-used models beyond."
    ),
    max_concurrent_loads: int = typer.Option(server_default("max_concurrent_loads"),
                                              "--max-concurrent-loads"),
    allow_python_models: bool = typer.Option(
        server_default("allow_python_models"), "--allow-python-models",
        help="Serve Python models (model.py runs arbitrary code).",
    ),
    auth_tokens: Path = typer.Option(
        None, "--auth-tokens", help="Tokens file (serval token create): require bearer tokens."
    ),
    tls_cert: Path = typer.Option(None, "--tls-cert", help="PEM certificate (HTTPS, gRPC TLS)."),
    tls_key: Path = typer.Option(None, "--tls-key", help="PEM private key for --tls-cert."),
    max_inflight: int = typer.Option(
        server_default("max_inflight"), "--max-inflight",
        help="Requests in the server at once; beyond, 429 at once.",
    ),
    default_timeout_ms: float = typer.Option(
        server_default("default_timeout_ms"), "--default-timeout-ms", parser=milliseconds,
        metavar="DURATION", help="Deadline for requests that set none (0: none).",
    ),
    metrics_top_k: int = typer.Option(
        server_default("metrics_top_k"), "--metrics-top-k",
        help="Per-model metric series for the K busiest; others summed.",
    ),
    metrics_port: int = typer.Option(
        server_default("metrics_port"), "--metrics-port",
        help="Serve GET /metrics on this port too, as Triton's metrics port (0: only on the "
        "HTTP port)."),
    triton_metrics: bool = typer.Option(
        server_default("triton_metrics"), "--triton-metrics/--no-triton-metrics",
        help="Also Triton's metric names on /metrics (nv_inference_*, nv_cache_*, nv_cpu_*), "
        "for dashboards and alerts written against Triton.",
    ),
    poll_interval_s: float = typer.Option(
        server_default("poll_interval_s"), "--poll-interval-s", parser=seconds, metavar="DURATION",
        help="Watch the repository: publishes, rollbacks and config edits hot-swap (0: off; "
        "Triton's --repository-poll-secs works too).",
    ),
    workers: str = typer.Option(
        str(server_default("workers")), metavar="N|auto",
        help="Serving processes sharing the port (SO_REUSEPORT), each with every model: for "
        "HTTP-bound models. N > 1 is refused for engine-bound ones (a batch-1 call >= 2 ms); "
        "auto: one per core where every model is HTTP-bound, else 1.",
    ),
    force_workers: bool = typer.Option(
        False, "--force-workers",
        help="Serve engine-bound models with --workers N > 1 all the same.",
    ),
    log_level: str = typer.Option(server_default("log_level"),
                                  help="debug, info, warning or error."),
    repository_api: bool = typer.Option(
        None, "--repository-api/--no-repository-api",
        help="Allow model load/unload over the API (default: on with --model-control "
        "explicit or lazy, off with all).",
    ),
    max_tensor_elements: int = typer.Option(
        server_default("max_tensor_elements"), "--max-tensor-elements",
        help="Most elements in one input tensor; beyond: 400.",
    ),
    strict_readiness: bool = typer.Option(
        server_default("strict_readiness"), "--strict-readiness/--no-strict-readiness",
        help="Ready (/v2/health/ready 200) only while every model that should serve is READY "
        "(control all: every model; explicit: those loaded; lazy: none), as Triton's flag."),
    shared_memory: bool = typer.Option(
        server_default("shared_memory"), "--shared-memory/--no-shared-memory",
        show_default="on for a loopback --host",
        help="Triton's system shared memory: clients that may infer register /dev/shm "
        "regions and pass tensors through them (off with --workers > 1)."),
    trace_file: Path = typer.Option(
        None, "--trace-file", metavar="PATH",
        help="Write sampled requests' timestamps here as JSON (Triton's trace extension; "
        "settings over /v2/trace/setting). Not with --workers > 1."),
    trace_config: list[str] = typer.Option(
        None, "--trace-config", metavar="SETTING=VALUE",
        help="Trace setting at start, as Triton's flag (repeatable): level=TIMESTAMPS, "
        "rate=N (every Nth request), count=N (-1: no limit), log-frequency=N."),
    triton_repository: Path = typer.Option(None, "--model-repository", hidden=True),
    triton_control: str = typer.Option(None, "--model-control-mode", hidden=True),
    triton_poll_s: float = typer.Option(None, "--repository-poll-secs", parser=seconds,
                                        hidden=True),
    cache_config: list[str] = typer.Option(
        None, "--cache-config", metavar="local,size=BYTES",
        help="Triton's response cache: this many bytes (1048576, 512MB, 2GiB) of results for "
        "the models whose config enables response_cache; one per worker. Default: none."),
    node_name: str = typer.Option(
        None, "--node-name", metavar="NAME", rich_help_panel=_BALANCER,
        help="This node's name in the serval-node header of every answer (1-64 of "
        "A-Z a-z 0-9 . _ : -; default: the host name)."),
    node_header: bool = typer.Option(
        server_default("node_header"), "--node-header/--no-node-header",
        rich_help_panel=_BALANCER, help="Name the node on every answer (serval-node)."),
    agent_port: int = typer.Option(
        server_default("agent_port"), "--agent-port", rich_help_panel=_BALANCER,
        help="HAProxy agent-check port: up, down, drain, and a weight from free capacity "
        "when asked 'weight' (0: off)."),
    drain_delay_s: float = typer.Option(
        server_default("drain_delay_s"), "--drain-delay-s", parser=seconds, metavar="DURATION",
        rich_help_panel=_BALANCER,
        help="On SIGTERM, report not ready (503, agent drain) and keep serving this long "
        "before the listeners close."),
    exit_timeout_s: float = typer.Option(
        server_default("exit_timeout_s"), "--exit-timeout-s", "--exit-timeout-secs",
        parser=seconds, metavar="DURATION", rich_help_panel=_BALANCER,
        help="On SIGTERM, after the drain delay, how long in-flight and queued requests may "
        "take; then the server exits anyway (a model that hangs cannot hold it up). An "
        "unloaded or replaced model version's in-flight requests get as long, then 503."),
    max_connections: int = _limit(
        "max_connections", "Open connections, HTTP and gRPC together; at the limit a new one "
        "replaces an idle one, first one that never finished a request (0: from the "
        "file-descriptor limit, at most 10,000)."),
    receive_budget_mb: float = _limit(
        "receive_budget_bytes", "Request bytes held server-wide; beyond, new requests get "
        "429 / RESOURCE_EXHAUSTED before their body is read.", MIB),
    tls_handshake_timeout_s: float = _limit("tls_handshake_timeout_s", "TLS handshake bound."),
    max_request_mb: float = _limit(
        "max_request_bytes", "Largest HTTP request body (inflated too); beyond: 413.", MIB),
    max_url_bytes: int = _limit("max_url_bytes", "Longest request target; beyond: 414."),
    max_header_bytes: int = _limit(
        "max_header_bytes", "Request line and headers together; beyond: 431."),
    max_header_count: int = _limit("max_header_count", "Headers in one request; beyond: 431."),
    header_timeout_s: float = _limit(
        "header_timeout_s", "A request's headers must arrive within this; else 408, close."),
    body_timeout_s: float = _limit(
        "body_timeout_s", "Longest pause while a body or a gRPC request arrives (else 408 "
        "and close, or CANCELLED), or while a client reads none of its answers (else close)."),
    keepalive_timeout_s: float = _limit(
        "keepalive_timeout_s", "An idle HTTP/1.1 connection is closed after this."),
    max_pipelined: int = _limit(
        "max_pipelined", "Requests read ahead of their answers on one HTTP/1.1 connection."),
    write_buffer_kb: float = _limit(
        "write_buffer_bytes", "Answers queued for a client that does not read; beyond, its "
        "connection is not read until it catches up.", KIB),
    grpc_max_message_mb: float = _limit(
        "max_message_bytes", "Largest gRPC message accepted or sent.", MIB),
    h2_max_concurrent_streams: int = _limit(
        "h2_max_concurrent_streams", "Open streams on one HTTP/2 connection."),
    h2_max_header_list_bytes: int = _limit(
        "h2_max_header_list_bytes", "Decoded headers of one HTTP/2 request (and its block)."),
    h2_stream_window_kb: float = _limit(
        "h2_stream_window_bytes", "HTTP/2 receive window of one stream.", KIB),
    h2_connection_window_mb: float = _limit(
        "h2_connection_window_bytes", "HTTP/2 receive window of one connection.", MIB),
    h2_max_stream_messages: int = _limit(
        "h2_max_stream_messages", "Requests of one gRPC stream received and not yet answered."),
    h2_preface_timeout_s: float = _limit(
        "h2_preface_timeout_s", "The client preface and SETTINGS must arrive within this."),
    h2_idle_timeout_s: float = _limit(
        "h2_idle_timeout_s", "An HTTP/2 connection with no open stream this long: GOAWAY."),
    h2_send_timeout_s: float = _limit(
        "h2_send_timeout_s", "Answers that wait this long on an HTTP/2 client taking none of "
        "them (no window, or not reading): close."),
    h2_abuse_window_s: float = _limit(
        "h2_abuse_window_s", "The window the next two budgets count in."),
    h2_max_control_frames: int = _limit(
        "h2_max_control_frames", "PING, SETTINGS, PRIORITY and empty frames per window; "
        "beyond: GOAWAY (ENHANCE_YOUR_CALM)."),
    h2_max_resets: int = _limit(
        "h2_max_resets", "Streams a client resets before their answer, per window; beyond: "
        "GOAWAY (ENHANCE_YOUR_CALM)."),
) -> None:
    """Serve every model in REPOSITORY over KServe v2 REST and gRPC."""
    from serval.server.runner import serve

    if repository is not None and triton_repository is not None:
        fail("give --repository or Triton's --model-repository, not both")
    repository = repository or triton_repository
    if repository is None:
        fail("Missing option '--repository' / '-r' (the model repository folder)")
    model_control, poll_interval_s = _triton_control(
        triton_control or model_control,
        poll_interval_s if triton_poll_s is None else triton_poll_s, triton_control is not None)
    try:
        limits = TransportLimits(
            max_connections=max_connections, receive_budget_bytes=int(receive_budget_mb * MIB),
            tls_handshake_timeout_s=tls_handshake_timeout_s,
            max_request_bytes=int(max_request_mb * MIB), max_url_bytes=max_url_bytes,
            max_header_bytes=max_header_bytes, max_header_count=max_header_count,
            header_timeout_s=header_timeout_s, body_timeout_s=body_timeout_s,
            keepalive_timeout_s=keepalive_timeout_s, max_pipelined=max_pipelined,
            write_buffer_bytes=int(write_buffer_kb * KIB),
            max_message_bytes=int(grpc_max_message_mb * MIB),
            h2_max_concurrent_streams=h2_max_concurrent_streams,
            h2_max_header_list_bytes=h2_max_header_list_bytes,
            h2_stream_window_bytes=int(h2_stream_window_kb * KIB),
            h2_connection_window_bytes=int(h2_connection_window_mb * MIB),
            h2_max_stream_messages=h2_max_stream_messages,
            h2_preface_timeout_s=h2_preface_timeout_s, h2_idle_timeout_s=h2_idle_timeout_s,
            h2_send_timeout_s=h2_send_timeout_s, h2_abuse_window_s=h2_abuse_window_s,
            h2_max_control_frames=h2_max_control_frames, h2_max_resets=h2_max_resets,
        )
        config = ServerConfig(
            repository=repository, host=host, http_port=http_port, grpc_port=grpc_port,
            workers=_workers(workers), force_workers=force_workers,
            model_control=model_control, load_models=load_models or [],
            memory_budget=memory_budget,
            max_concurrent_loads=max_concurrent_loads, poll_interval_s=poll_interval_s,
            metrics_top_k=metrics_top_k, triton_metrics=triton_metrics,
            metrics_port=metrics_port,
            allow_python_models=allow_python_models,
            max_inflight=max_inflight, default_timeout_ms=default_timeout_ms,
            auth_tokens=auth_tokens, tls_cert=tls_cert, tls_key=tls_key,
            log_level=log_level, repository_api=repository_api,
            max_tensor_elements=max_tensor_elements, limits=limits,
            strict_readiness=strict_readiness, shared_memory=shared_memory,
            node_name=node_name, node_header=node_header, agent_port=agent_port,
            drain_delay_s=drain_delay_s, exit_timeout_s=exit_timeout_s, trace_file=trace_file,
            trace=_trace_settings(trace_file, trace_config or []),
            response_cache_bytes=_cache_size(cache_config or []),
        )
    except ValidationError as exc:
        raise typer.BadParameter(_one_line(exc)) from None
    except LimitError as exc:
        raise typer.BadParameter(f"{_LIMIT_FLAGS.get(exc.field, _flag(exc.field))}: {exc}"
                                 ) from None
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if not repository.is_dir():
        fail(f"model repository '{repository}' is not a directory")
    if isinstance(config.workers, int) and config.workers > 1 and http_port == 0:
        fail("--workers > 1 needs a fixed --http-port (the workers share it)")
    if trace_file is not None and (config.workers == "auto" or config.worker_count > 1):
        fail("--trace-file needs --workers 1 (every worker would write the same file)")
    if grpc_port and grpc_port == http_port:
        fail(f"--grpc-port and --http-port are both {grpc_port}")
    _check_tls(tls_cert, tls_key)
    _check_tokens(auth_tokens)
    try:
        serve(config)
    except ConfigError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(str(exc) if exc.strerror is None else f"{exc.strerror}: {exc.filename or exc}")


_TRACE_NAMES = {"level": "trace_level", "rate": "trace_rate", "count": "trace_count",
                "log-frequency": "log_frequency", "mode": "trace_mode"}


def _trace_settings(trace_file: Path | None, items: list[str]) -> dict[str, Any]:
    """--trace-config SETTING=VALUE flags (Triton's names, `triton,` prefix allowed) as the
    trace extension's settings, checked as an API update would be."""
    from serval.observability.trace import Tracer

    settings: dict[str, Any] = {}
    for item in items:
        name, equals, value = item.removeprefix("triton,").partition("=")
        if not equals or name not in _TRACE_NAMES:
            raise typer.BadParameter(f"--trace-config takes SETTING=VALUE with SETTING one of "
                                     f"{', '.join(_TRACE_NAMES)}, got {item!r}")
        key = _TRACE_NAMES[name]
        settings[key] = [*settings.get(key, []), value] if key == "trace_level" else value
    if trace_file is not None and not trace_file.parent.is_dir():
        raise typer.BadParameter(f"--trace-file: folder '{trace_file.parent}' does not exist")
    try:
        Tracer(trace_file, settings)
    except ServalError as exc:
        raise typer.BadParameter(f"--trace-config: {exc.message}") from None
    return settings


TRITON_POLL_S = 15.0  # Triton's --repository-poll-secs default


def _triton_control(mode: str, poll_interval_s: float, triton_mode: bool
                    ) -> tuple[str, float]:
    """Triton's --model-control-mode names onto Serval's: none is all; poll is all, watching
    the repository (every 15 s unless told)."""
    if triton_mode and mode not in ("none", "poll", "explicit"):
        raise typer.BadParameter(f"--model-control-mode takes none, poll or explicit "
                                 f"(Triton's), got {mode!r}")
    if mode == "none":
        return "all", poll_interval_s
    if mode == "poll":
        return "all", poll_interval_s or TRITON_POLL_S
    return mode, poll_interval_s


def _cache_size(items: list[str]) -> int:
    """--cache-config local,size=BYTES (Triton's flag; the last one counts) in bytes."""
    from pydantic import ByteSize, TypeAdapter

    size = 0
    for item in items:
        kind, _, setting = item.partition(",")
        name, equals, value = setting.partition("=")
        if kind != "local" or name != "size" or not equals:
            raise typer.BadParameter(f"--cache-config takes local,size=BYTES (only Triton's "
                                     f"local cache, sized), got {item!r}")
        try:
            size = int(TypeAdapter(ByteSize).validate_python(value.strip()))
        except ValidationError:
            raise typer.BadParameter(f"--cache-config: size {value!r} is not a size in bytes "
                                     "(such as 1048576, 512MB or 2GiB)") from None
    return size


def _workers(text: str) -> int | str:
    """--workers: a count or `auto` (ServerConfig checks the range)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise typer.BadParameter(f"--workers takes a number or auto, got {text!r}") from None


def _check_tokens(path: Path | None) -> None:
    """A tokens file that does not read fails here, before any model loads."""
    from serval.auth import TokenStore

    if path is not None:
        try:
            TokenStore.from_file(path)
        except ConfigError as exc:
            fail(str(exc))


def _check_tls(cert: Path | None, key: Path | None) -> None:
    """A certificate and key that do not load fail here, not later as a failure to listen."""
    from serval.server.listen import tls_context

    try:
        tls_context(cert, key)  # None without both: ServerConfig refuses one without the other
    except OSError as exc:  # ssl.SSLError included
        fail(f"--tls-cert {cert} with --tls-key {key}: cannot load them: {exc.strerror or exc}")


def _one_line(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message
