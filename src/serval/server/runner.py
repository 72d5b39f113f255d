"""Starts Serval: load the repository, serve HTTP, drain on SIGTERM; optional worker processes."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from typing import TYPE_CHECKING

from serval.auth import TokenStore
from serval.backends.base import BackendOptions
from serval.config import ServerConfig
from serval.dataplane import DataPlane
from serval.observability.logging import configure_logging
from serval.observability.metrics import (
    ModelMetricsCollector,
    RegistryGauges,
    RegistryMetricsCollector,
    build_registry,
)
from serval.repository.backends import BackendTable
from serval.repository.registry import ModelRegistry
from serval.repository.watcher import watch_repository
from serval.server.http.app import HttpApp
from serval.server.http.protocol import ConnectionTracker, HttpProtocol
from serval.server.http.ui.status import ServerStatus
from serval.server.limits import TransportGuards
from serval.server.listen import bind_socket, serve_on, tls_context
from serval.server.supervisor import Supervisor

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from serval.server.grpc.server import GrpcServer

log = logging.getLogger(__name__)

GRACEFUL_SHUTDOWN_S = 30
def available_cores() -> int:
    """Cores this process may run on (affinity-aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def serve(config: ServerConfig) -> None:
    """Run the server in this process, or in `workers` processes sharing the port."""
    if config.workers == 1:
        run_worker(config, reuse_port=False)
        return
    configure_logging(config.log_level)
    code = Supervisor(config.workers, run_worker, (config, True)).run()
    if code:
        raise SystemExit(code)


def run_worker(config: ServerConfig, reuse_port: bool) -> None:
    """One serving process: its own event loop, registry, batchers and engines."""
    configure_logging(config.log_level)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        log.info("uvloop not installed; using the default asyncio loop")
    asyncio.run(_serve_async(config, reuse_port))


async def _serve_async(config: ServerConfig, reuse_port: bool) -> None:
    sock = bind_socket(config.host, config.http_port, reuse_port)
    cores = max(1, available_cores() // config.workers)
    registry = build_model_registry(config, cores)
    await registry.start()
    watcher = None
    if config.poll_interval_s > 0:
        watcher = asyncio.create_task(watch_repository(registry, config.poll_interval_s))
    dataplane = DataPlane(registry, max_inflight=config.max_inflight,
                          default_timeout_ms=config.default_timeout_ms,
                          repository_api=config.repository_api_enabled,
                          max_tensor_elements=config.max_tensor_elements)
    metrics = build_metrics(registry, config.metrics_top_k)
    auth = TokenStore.from_file(config.auth_tokens) if config.auth_tokens else None
    status = ServerStatus(registry)  # the status page's 1 s samples (off the request path)
    sampler = asyncio.create_task(status.run())
    guards = TransportGuards.build(config.limits)
    app = HttpApp(dataplane, metrics, auth, status, guards.limits.max_request_bytes)
    tracker = ConnectionTracker()
    loop = asyncio.get_running_loop()
    server = await serve_on(sock, lambda: HttpProtocol(app, tracker, guards),
                            tls_context(config.tls_cert, config.tls_key),
                            config.limits.tls_handshake_timeout_s, guards.gate)
    grpc_server = await _start_grpc(dataplane, config, reuse_port, auth, guards)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    gc.collect()
    gc.freeze()  # loaded models and module state never need scanning again
    dataplane.set_ready(True)
    log.info("serving", extra={"host": config.host, "http_port": sock.getsockname()[1],
                                "grpc_port": config.grpc_port or None,
                                "models": len(registry.all_models()), "pid": os.getpid()})
    await stop.wait()
    log.info("shutting down: finishing in-flight requests", extra={"pid": os.getpid()})
    dataplane.set_ready(False)
    if watcher is not None:
        watcher.cancel()
    sampler.cancel()
    server.close()
    await asyncio.gather(
        tracker.shutdown(GRACEFUL_SHUTDOWN_S),
        grpc_server.stop(GRACEFUL_SHUTDOWN_S) if grpc_server else asyncio.sleep(0),
    )
    await registry.drain()
    await registry.close()


def build_model_registry(config: ServerConfig, cores: int) -> ModelRegistry:
    """The registry with every backend, sized to `cores` (not started)."""
    backends = BackendTable(BackendOptions(cores, config.allow_python_models))
    return ModelRegistry(
        config.repository, backends, control=config.model_control,
        memory_budget_bytes=int(config.memory_budget) if config.memory_budget else None,
        max_concurrent_loads=config.max_concurrent_loads,
        engine_threads=max(8, 2 * cores),
    )


def build_metrics(registry: ModelRegistry, top_k: int) -> CollectorRegistry:
    """The Prometheus registry: per-model series and the registry's gauges."""
    return build_registry(
        ModelMetricsCollector(registry.all_models, registry.totals, top_k=top_k),
        RegistryMetricsCollector(lambda: RegistryGauges(
            registry.loads, registry.evictions, registry.resident_bytes,
            registry.memory_budget_bytes, registry.hits, registry.misses,
            registry.load_seconds)),
    )


async def _start_grpc(dataplane: DataPlane, config: ServerConfig, reuse_port: bool,
                      auth: TokenStore | None, guards: TransportGuards) -> GrpcServer | None:
    if config.grpc_port == 0:
        return None
    from serval.server.grpc.server import start_grpc_server

    return await start_grpc_server(
        dataplane, config.host, config.grpc_port,
        guards=guards, reuse_port=reuse_port, auth=auth,
        tls=(config.tls_cert, config.tls_key) if config.tls_cert and config.tls_key else None,
    )
