"""The server's validated configuration (ServerConfig, from CLI flags) and its transport
limits; a model's configuration is serval.model_config."""

from __future__ import annotations

import math
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ByteSize, Field, field_validator, model_validator

from serval.errors import ConfigError
from serval.model_config import Strict

MAX_WORKERS = 64
_NODE_NAME = re.compile(r"[A-Za-z0-9._:-]{1,64}")


MIB = 1024 * 1024
H2_MAX_WINDOW = 2**31 - 1  # RFC 9113 6.9.1: the largest flow-control window
_U32 = 2**32 - 1  # an HTTP/2 SETTINGS value; a gRPC message's length prefix
# the largest value a limit may take where its protocol sets one: beyond, the server could
# not announce or frame it (a window of 2^31 bytes breaks every HTTP/2 connection)
LIMIT_MAXIMA = {
    "h2_stream_window_bytes": (H2_MAX_WINDOW, "HTTP/2's largest window"),
    "h2_connection_window_bytes": (H2_MAX_WINDOW, "HTTP/2's largest window"),
    "h2_max_concurrent_streams": (H2_MAX_WINDOW, "HTTP/2's stream identifiers"),
    "h2_max_header_list_bytes": (_U32, "an HTTP/2 SETTINGS value"),
    "max_message_bytes": (_U32, "a gRPC message's 4-byte length"),
}


class LimitError(ValueError):
    """A transport limit out of its range; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"transport limit {field} {message}")
        self.field = field


@dataclass(frozen=True)
class TransportLimits:
    """Every transport limit, timeout and budget (serval.server.limits enforces them); each has a
    `serval serve` flag of the same name."""

    # both transports
    max_connections: int = 0  # 0: auto, from the file-descriptor limit
    tls_handshake_timeout_s: float = 10.0
    receive_budget_bytes: int = 192 * MIB
    # HTTP/1.1
    max_request_bytes: int = 64 * MIB  # one body, inflated too (--max-request-mb)
    max_url_bytes: int = 8 * 1024
    max_header_bytes: int = 64 * 1024  # request line and headers together
    max_header_count: int = 100
    header_timeout_s: float = 10.0  # from the first byte of a request to the end of its headers
    body_timeout_s: float = 30.0  # longest pause in a body or gRPC request, or in reading answers
    keepalive_timeout_s: float = 75.0  # idle between requests
    max_pipelined: int = 32  # requests read ahead of their answers on one connection
    write_buffer_bytes: int = 1 * MIB  # answers queued for a client before reading stops
    # HTTP/2 (gRPC)
    max_message_bytes: int = 64 * MIB  # one gRPC message, received or sent
    h2_max_concurrent_streams: int = 1024
    h2_max_header_list_bytes: int = 64 * 1024
    h2_stream_window_bytes: int = 1 * MIB
    h2_connection_window_bytes: int = 16 * MIB
    h2_max_stream_messages: int = 128  # requests of one stream received and not yet answered
    h2_preface_timeout_s: float = 10.0  # the client's preface and SETTINGS
    h2_idle_timeout_s: float = 300.0  # no open stream this long: GOAWAY
    h2_send_timeout_s: float = 60.0  # answers waiting on a client that takes none: close
    h2_abuse_window_s: float = 10.0
    h2_max_control_frames: int = 1000  # PING, SETTINGS, PRIORITY, empty frames per window
    h2_max_resets: int = 1000  # streams the client reset before their answer, per window

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not math.isfinite(value):
                raise LimitError(name, f"must be a finite number, got {value}")
            if value < 0 or (value == 0 and name != "max_connections"):
                raise LimitError(name, f"must be positive, got {value}")
            maximum, why = LIMIT_MAXIMA.get(name, (None, ""))
            if maximum is not None and value > maximum:
                raise LimitError(name, f"must be at most {maximum:,} ({why}), got {value:,}")


class ServerConfig(Strict):
    """The running server's settings, from CLI flags."""

    repository: Path
    host: str = "127.0.0.1"
    http_port: int = Field(8000, ge=0, le=65535)
    grpc_port: int = Field(8001, ge=0, le=65535, description="0 disables gRPC")
    workers: int | Literal["auto"] = Field(
        1, description="serving processes; auto: as many as the cores where every model is "
                       "HTTP-bound, else 1 (server/workers.py resolves it before serving)")
    force_workers: bool = Field(False, description="serve engine-bound models with workers > 1")
    model_control: Literal["all", "lazy", "explicit"] = "all"
    load_models: list[str] = Field(
        default_factory=list, description="explicit control: load these at start (* = all)")
    memory_budget: ByteSize | None = Field(
        None, description="evict least-recently-used idle models beyond this many bytes"
    )
    response_cache_bytes: ByteSize = Field(
        ByteSize(0), description="Triton's response cache (results of models that enable it); "
        "0: none")
    max_concurrent_loads: int = Field(2, ge=1, le=64)
    allow_python_models: bool = Field(False, description="python models run arbitrary code")
    auth_tokens: Path | None = Field(None, description="tokens file: bearer auth when set")
    tls_cert: Path | None = Field(None, description="PEM certificate: HTTPS and gRPC over TLS")
    tls_key: Path | None = None

    @field_validator("workers")
    @classmethod
    def _worker_range(cls, value: int | str) -> int | str:
        if isinstance(value, int) and not 1 <= value <= MAX_WORKERS:
            raise ValueError(f"workers must be 1 to {MAX_WORKERS} or auto, got {value}")
        return value

    @property
    def worker_count(self) -> int:
        """The resolved number of serving processes (ValueError while still `auto`)."""
        if not isinstance(self.workers, int):
            raise ValueError("workers is still 'auto': resolve it first (server/workers.py)")
        return self.workers

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.load_models and self.model_control != "explicit":
            raise ValueError("--load-model needs --model-control explicit (as Triton's)")
        return self
    max_inflight: int = Field(4096, ge=1, description="requests in the server at once; 429 past")
    default_timeout_ms: float = Field(0.0, ge=0.0, description="0: requests have no deadline")
    metrics_top_k: int = Field(100, ge=1, description="per-model series for the K busiest")
    triton_metrics: bool = Field(False, description="Triton's nv_* metric names on /metrics too")
    poll_interval_s: float = Field(0.0, ge=0.0, description="0: never poll the repository")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    trace_file: Path | None = Field(None, description="where sampled requests' traces go")
    trace: dict[str, str | list[str]] = Field(
        default_factory=dict, description="trace settings at start (observability/trace.py)")
    repository_api: bool | None = Field(
        None, description="load/unload over the API; None: on with model control lazy/explicit"
    )
    limits: TransportLimits = Field(default_factory=TransportLimits,
                                    description="per-connection limits, timeouts and budgets")
    max_tensor_elements: int = Field(
        64 * 1024 * 1024, ge=1, description="elements in one input tensor beyond: 400"
    )
    strict_readiness: bool = Field(
        True, description="ready only while every model that should serve is READY (Triton's)")
    shared_memory: bool | None = Field(
        None, description="Triton's system shared memory extension (regions under /dev/shm); "
        "None: on only while the server listens on a loopback address (same-host clients)")
    # behind a load balancer (HAProxy)
    node_name: str | None = Field(
        None, description="the serval-node answer header's value; None: this host's name")
    node_header: bool = Field(True, description="every answer names its node (serval-node)")
    agent_port: int = Field(0, ge=0, le=65535, description="HAProxy agent check; 0: off")
    metrics_port: int = Field(0, ge=0, le=65535, description="GET /metrics on this port too "
                              "(Triton's --metrics-port); 0: on the HTTP port only")
    drain_delay_s: float = Field(
        0.0, ge=0.0, description="on SIGTERM: not ready, still serving, this long; then drain")
    exit_timeout_s: float = Field(
        30.0, ge=0.0, le=86_400.0,
        description="on SIGTERM, after the drain delay: how long in-flight and queued work may "
        "take before the server exits anyway (Triton's --exit-timeout-secs); an unloaded or "
        "replaced model version's in-flight requests get as long, then 503")

    @field_validator("node_name")
    @classmethod
    def _valid_node_name(cls, name: str | None) -> str | None:
        return None if name is None else check_node_name(name)

    @model_validator(mode="after")
    def _agent_port_apart(self) -> ServerConfig:
        if self.agent_port and self.agent_port in (self.http_port, self.grpc_port):
            raise ValueError(f"--agent-port {self.agent_port} is also the HTTP or gRPC port")
        if self.metrics_port and self.metrics_port in (self.http_port, self.grpc_port,
                                                       self.agent_port):
            raise ValueError(f"--metrics-port {self.metrics_port} is also the HTTP, gRPC or "
                             "agent port")
        return self

    def resolved_node_name(self) -> str:
        """node_name, else this host's name; ConfigError when the host's name is not a valid
        node name (then --node-name must give one)."""
        if self.node_name is not None:
            return self.node_name
        host = socket.gethostname()
        try:
            return check_node_name(host)
        except ValueError as exc:
            raise ConfigError(f"{exc} (it is this host's name): give one with --node-name"
                              ) from None

    @property
    def repository_api_enabled(self) -> bool:
        """Triton's rule: model control explicit (and lazy) enable load/unload, else a flag."""
        if self.repository_api is not None:
            return self.repository_api
        return self.model_control != "all"


def check_node_name(name: str) -> str:
    """A node name as HAProxy and the serval-node header take it; ValueError otherwise."""
    if not _NODE_NAME.fullmatch(name):
        raise ValueError(f"node name {name[:80]!r} must be 1 to 64 characters of "
                         "A-Z a-z 0-9 . _ : -")
    return name


def server_default(name: str) -> Any:
    """The default of one ServerConfig setting: flags, the cluster's config and the classes
    the server builds read it here, so each default is written once."""
    return ServerConfig.model_fields[name].default
