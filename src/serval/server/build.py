"""The one server builder: from a ServerConfig to the serving stack (registry, data plane,
metrics, status sampler, auth, limits, the v2 routes) and, for `serve`, its HTTP and gRPC
listeners. `serve`, `--workers` and the cluster node all build through here."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import ipaddress
import logging
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from serval.auth import TokenStore
from serval.backends.base import BackendOptions
from serval.backends.cores import usable_cores
from serval.config import ServerConfig, server_default
from serval.dataplane import DataPlane
from serval.errors import ConfigError, LoadFailed, ModelNotReady
from serval.observability.logging import log_control
from serval.observability.metrics import (
    Exposition,
    ModelSeries,
    RegistryGauges,
    RegistryMetricsCollector,
    TransportGauges,
    TransportMetricsCollector,
)
from serval.observability.trace import Tracer
from serval.observability.triton_metrics import CpuCollector
from serval.protocol.shared_memory import SharedMemoryRegistry
from serval.repository.backends import BackendTable
from serval.repository.registry import ModelRegistry
from serval.repository.watcher import watch_repository
from serval.server.agent import AgentServer, NodeState
from serval.server.http.app import HttpApp
from serval.server.http.metrics_port import MetricsPortApp
from serval.server.http.protocol import ConnectionTracker, HttpProtocol
from serval.server.http.ui.status import ServerStatus
from serval.server.http.wire import ServerHeaders
from serval.server.limits import ReceiveBudget, TransportGuards
from serval.server.listen import bind_socket, serve_on, tls_context
from serval.server.streams import model_stream

if TYPE_CHECKING:
    from serval.server.grpc.server import GrpcServer

log = logging.getLogger(__name__)
GRACEFUL_SHUTDOWN_S: float = server_default("exit_timeout_s")  # --exit-timeout-s
NODE_HEADER = "serval-node"  # on every answer: which node behind the load balancer answered
SAMPLER_TASK = "status-sampler"


@dataclass
class ServingStack:
    """Everything that answers requests, without listeners: what a cluster node serves with."""

    config: ServerConfig
    registry: ModelRegistry
    dataplane: DataPlane
    app: HttpApp
    auth: TokenStore | None
    guards: TransportGuards
    status: ServerStatus
    tasks: list[asyncio.Task[None]] = field(default_factory=list)  # sampler, repository poll


async def build_stack(config: ServerConfig, cores: int | None = None) -> ServingStack:
    """Start the registry (loading what the model control says), its repository poll, the
    data plane, metrics, auth and the status sampler; the data plane is not ready yet.

    `cores` is this process's share for the engines (default: the process's cores divided
    among `config.workers`)."""
    cores = max(1, usable_cores() // config.worker_count if cores is None else cores)
    registry = build_model_registry(config, cores)
    await registry.start()
    tasks: list[asyncio.Task[None]] = []
    if config.poll_interval_s > 0:
        tasks.append(asyncio.create_task(watch_repository(registry, config.poll_interval_s)))
    guards = TransportGuards.build(config.limits)
    dataplane = DataPlane(registry, max_inflight=config.max_inflight,
                          default_timeout_ms=config.default_timeout_ms,
                          repository_api=config.repository_api_enabled,
                          max_tensor_elements=config.max_tensor_elements,
                          strict_readiness=config.strict_readiness,
                          shared_memory=shared_memory_registry(config, guards.budget),
                          logs=log_control(), tracer=Tracer(config.trace_file, config.trace))
    registry.route_streams(functools.partial(model_stream, dataplane))  # BLS, decoupled=True
    await load_at_start(dataplane, config.load_models)
    auth = TokenStore.from_file(config.auth_tokens) if config.auth_tokens else None
    status = ServerStatus(registry)  # the status page's 1 s samples (off the request path)
    tasks.append(asyncio.create_task(status.run(), name=SAMPLER_TASK))
    dataplane.max_override_bytes = max(guards.limits.max_request_bytes,  # a load's files
                                       guards.limits.max_message_bytes)
    app = HttpApp(dataplane, build_metrics(registry, guards, config.metrics_top_k, dataplane,
                                           config.triton_metrics),
                  auth, status, guards.limits.max_request_bytes)
    return ServingStack(config, registry, dataplane, app, auth, guards, status, tasks)


async def load_at_start(dataplane: DataPlane, names: list[str]) -> None:
    """--load-model (explicit control, as Triton's): these models load before the server
    listens (`*`: every model). An unknown name stops the start (ConfigError); a model that
    fails to load is UNAVAILABLE with its reason and, asked for, keeps the server not ready."""
    registry = dataplane.registry
    known = registry.model_names()
    wanted = known if "*" in names else list(dict.fromkeys(names))
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise ConfigError(f"--load-model {unknown[0]}: no model folder of that name in the "
                          "repository")
    for name in wanted:
        with contextlib.suppress(ModelNotReady, LoadFailed):  # the registry logs why
            await registry.load(name)
        dataplane.mark_asked(name)


async def close_stack(stack: ServingStack, grace_s: float = GRACEFUL_SHUTDOWN_S) -> bool:
    """Not ready; stop the background tasks; finish queued work (up to grace_s); release
    every engine. False when work was still queued or running at the end of grace_s (a model
    that hangs): the caller then exits without waiting for it."""
    stack.dataplane.set_ready(False)
    for task in stack.tasks:
        task.cancel()
    try:
        await asyncio.wait_for(stack.registry.drain(), max(grace_s, 0.0))
        drained = True
    except TimeoutError:
        drained = False
        log.warning("shutting down with work unfinished: a model did not finish its queued "
                    "or running requests in time", extra={"exit_timeout_s": grace_s})
    await stack.registry.close()
    stack.app.close()  # its JSON coding process
    stack.dataplane.tracer.close()  # traces still waiting go to the trace file
    if stack.dataplane.shared_memory is not None:  # every client region unmapped
        released = stack.dataplane.shared_memory.close()
        log.info("shared memory released", extra={"regions": released})
    return drained


def shared_memory_registry(config: ServerConfig, budget: ReceiveBudget
                           ) -> SharedMemoryRegistry | None:
    """Triton's system shared memory when asked for, or by default while the server listens
    on a loopback address only (then every client is on this host; listening beyond it, a
    client that may infer could read and write the server user's /dev/shm objects: Triton
    too has it off unless --allow-client-shm). Off with --workers > 1 (a region registered
    with one worker process would be unknown to the others). Inputs read from regions count
    against the transports' receive budget, as bodies do."""
    wanted = config.shared_memory
    if wanted is None:
        wanted = _is_loopback(config.host)
    if not wanted or config.worker_count != 1:
        return None
    return SharedMemoryRegistry(budget=budget)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return host == "localhost"


def own_headers(config: ServerConfig) -> tuple[tuple[str, str], ...]:
    """The headers every answer of this server carries: serval-node, unless turned off.
    ConfigError when no node name is given and the host's name is not a valid one."""
    if not config.node_header:
        return ()
    return ((NODE_HEADER, config.resolved_node_name()),)


def build_model_registry(config: ServerConfig, cores: int) -> ModelRegistry:
    """The registry over the backend table, sized to `cores` (not started)."""
    return ModelRegistry(
        config.repository, BackendTable(BackendOptions(cores, config.allow_python_models)),
        control=config.model_control,
        memory_budget_bytes=int(config.memory_budget) if config.memory_budget else None,
        max_concurrent_loads=config.max_concurrent_loads,
        engine_threads=max(8, 2 * cores),
        response_cache_bytes=int(config.response_cache_bytes),
        retire_timeout_s=config.exit_timeout_s,
    )


def build_metrics(registry: ModelRegistry, guards: TransportGuards, top_k: int,
                  dataplane: DataPlane | None = None, triton: bool = False) -> Exposition:
    """/metrics: per-model series, the registry's gauges, the transports'; `triton`: Triton's
    metric names too."""
    return Exposition(
        ModelSeries(registry.all_models, registry.totals, top_k=top_k, triton=triton),
        RegistryMetricsCollector(lambda: RegistryGauges(
            registry.loads, registry.evictions, registry.resident_bytes,
            registry.memory_budget_bytes, registry.hits, registry.misses,
            registry.load_seconds, registry.cache.capacity, registry.cache.bytes,
            len(registry.cache), registry.cache.evictions)),
        TransportMetricsCollector(lambda: transport_gauges(guards, dataplane)),
        *([CpuCollector()] if triton else []),
    )


def transport_gauges(guards: TransportGuards, dataplane: DataPlane | None = None
                     ) -> TransportGauges:
    """What the transports' guards and the in-flight limit hold and have refused, read at
    scrape time."""
    return TransportGauges(guards.gate.count, guards.gate.max_connections,
                           dict(guards.abuse.counts), guards.budget.held_bytes,
                           guards.budget.limit_bytes, guards.budget.refused,
                           *((dataplane.inflight, dataplane.max_inflight,
                              dataplane.inflight_refusals) if dataplane else (0, 0, 0)),
                           guards.backlog.held_bytes)


@dataclass
class Server:
    """A serving stack behind its HTTP listener and, unless grpc_port is 0, its gRPC one; with
    an agent_port, HAProxy's agent check beside them (server/agent.py)."""

    stack: ServingStack
    http: asyncio.Server
    connections: ConnectionTracker
    grpc: GrpcServer | None
    node: NodeState
    agent: AgentServer | None = None
    metrics: asyncio.Server | None = None  # --metrics-port: GET /metrics alone
    hurry: asyncio.Event = field(default_factory=asyncio.Event)  # set: cut the drain delay short

    @property
    def agent_port(self) -> int | None:
        return self.agent.port if self.agent is not None else None

    @property
    def http_port(self) -> int:
        return int(self.http.sockets[0].getsockname()[1])

    @property
    def grpc_port(self) -> int | None:
        return self.grpc.port if self.grpc is not None else None


async def start_server(config: ServerConfig, *, reuse_port: bool = False,
                       freeze_gc: bool = False) -> Server:
    """Bind every port first (a port in use fails before any model loads, naming its flag)
    and start the agent check (`down#not ready` until the end), build the stack, listen on
    both transports, then report ready. OSError when a port cannot be bound; ConfigError for
    a bad tokens file or TLS pair, or no valid node name.

    `freeze_gc` (a serving process): the loaded models and module state are moved out of
    the cycle collector's reach before the first request."""
    headers = own_headers(config)
    sock = _bind(config.host, config.http_port, "--http-port", reuse_port)
    node = NodeState()  # the agent answers `down#not ready` while the models load
    agent = grpc_sock = metrics_sock = None
    try:
        if config.grpc_port:
            grpc_sock = _bind(config.host, config.grpc_port, "--grpc-port", reuse_port)
        if config.metrics_port:
            metrics_sock = _bind(config.host, config.metrics_port, "--metrics-port", reuse_port)
        if config.agent_port:
            agent = AgentServer(node.reply)
            await agent.start(_bind(config.host, config.agent_port, "--agent-port", reuse_port))
        stack = await build_stack(config)
    except BaseException:
        sock.close()
        for other in (grpc_sock, metrics_sock):
            if other is not None:
                other.close()
        if agent is not None:
            agent.close()
        raise
    node.dataplane, node.receive_budget = stack.dataplane, stack.guards.budget
    guards = stack.guards
    tracker = ConnectionTracker()
    http_headers = ServerHeaders([(name.encode(), value.encode()) for name, value in headers])
    tls = tls_context(config.tls_cert, config.tls_key)
    http = await serve_on(sock, lambda: HttpProtocol(stack.app, tracker, guards, http_headers),
                          tls, config.limits.tls_handshake_timeout_s, guards.gate)
    metrics = None
    if metrics_sock is not None:
        only_metrics = MetricsPortApp(stack.app)
        metrics = await serve_on(
            metrics_sock, lambda: HttpProtocol(only_metrics, tracker, guards, http_headers),
            tls, config.limits.tls_handshake_timeout_s, guards.gate)
    grpc = None
    if grpc_sock is not None:  # grpc_port 0: the gRPC stack is never imported
        from serval.server.grpc.server import start_grpc_server

        grpc = await start_grpc_server(
            stack.dataplane, grpc_sock, guards=guards, auth=stack.auth,
            tls=(config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key
            else None, own_headers=headers)
    if freeze_gc:
        gc.collect()
        gc.freeze()
    stack.dataplane.set_ready(True)
    return Server(stack, http, tracker, grpc, node, agent, metrics=metrics)


def check_ports_free(config: ServerConfig) -> None:
    """OSError naming the flag of a port something already listens on. Before workers start:
    each binds with SO_REUSEPORT, which would share a port with another server of this user
    (two servers answering one port) where a plain bind fails."""
    for flag, port in (("--http-port", config.http_port), ("--grpc-port", config.grpc_port),
                       ("--agent-port", config.agent_port),
                       ("--metrics-port", config.metrics_port)):
        if port:
            _bind(config.host, port, flag, reuse_port=False).close()


def _bind(host: str, port: int, flag: str, reuse_port: bool) -> socket.socket:
    """A listening socket; OSError naming the address and its flag when it cannot be had."""
    try:
        return bind_socket(host, port, reuse_port)
    except OSError as exc:
        raise OSError(f"cannot listen on {host}:{port} ({flag}): "
                      f"{exc.strerror or exc}") from None


async def stop_server(server: Server, grace_s: float = GRACEFUL_SHUTDOWN_S) -> bool:
    """Turn not ready (health 503, agent `drain`) and go on serving for the drain delay, so
    the proxy steers new work away (`hurry` cuts it short); then close the listeners, let
    in-flight requests finish (up to grace_s) and release the models."""
    server.node.draining = True
    server.stack.dataplane.set_ready(False)
    delay_s = server.stack.config.drain_delay_s
    if delay_s > 0 and not server.hurry.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.hurry.wait(), delay_s)
    for task in server.stack.tasks:
        task.cancel()
    server.http.close()
    if server.metrics is not None:
        server.metrics.close()
    if server.agent is not None:
        server.agent.close()  # it answered `drain` until now
    started = asyncio.get_running_loop().time()
    await asyncio.gather(
        server.connections.shutdown(grace_s),
        server.grpc.stop(grace_s) if server.grpc else asyncio.sleep(0),
    )
    left_s = grace_s - (asyncio.get_running_loop().time() - started)
    return await close_stack(server.stack, left_s)

