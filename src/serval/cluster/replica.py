"""One Serval data plane inside a Ray Serve replica: registry, batchers, backends, v2 routes."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path

from serval.cluster.config import ClusterConfig
from serval.cluster.mirror import RepositoryMirror
from serval.dataplane import DataPlane
from serval.repository.registry import ModelRegistry
from serval.repository.served import ModelState
from serval.repository.watcher import watch_repository
from serval.server.http.app import HttpApp, RawHeaders, Reply
from serval.server.runner import build_metrics, build_model_registry

log = logging.getLogger(__name__)

REPLICA_HEADER = b"serval-replica"


@dataclass
class ReplicaStack:
    """What a started replica serves with."""

    registry: ModelRegistry
    app: HttpApp
    tasks: list[asyncio.Task[None]]


async def start_stack(config: ClusterConfig) -> ReplicaStack:
    """Mirror the repository if remote, start the registry lazily, poll for publishes."""
    root, mirror = _local_root(config)
    if mirror is not None:
        await asyncio.to_thread(mirror.sync)
    server_config = config.server_config(root)
    cores = max(1, int(config.replica_cpus))
    registry = build_model_registry(server_config, cores)
    await registry.start()
    tasks: list[asyncio.Task[None]] = []
    if config.poll_interval_s > 0:
        if mirror is not None:
            tasks.append(asyncio.create_task(_keep_mirrored(mirror, config.poll_interval_s)))
        tasks.append(asyncio.create_task(watch_repository(registry, config.poll_interval_s)))
    dataplane = DataPlane(registry, max_inflight=config.max_inflight,
                          default_timeout_ms=config.default_timeout_ms,
                          repository_api=server_config.repository_api_enabled,
                          max_tensor_elements=server_config.max_tensor_elements)
    dataplane.set_ready(True)
    return ReplicaStack(registry, HttpApp(dataplane, build_metrics(registry, 100)), tasks)


async def stop_stack(stack: ReplicaStack) -> None:
    """Finish in-flight requests, then unload every model."""
    for task in stack.tasks:
        task.cancel()
    stack.app.dataplane.set_ready(False)
    await stack.registry.drain()
    await stack.registry.close()


def resident_models(registry: ModelRegistry) -> set[str]:
    """Names of models with at least one version loaded in this replica."""
    return {served.name for served in registry.all_models() if served.ready}


def held_models(registry: ModelRegistry) -> set[str]:
    """Models loaded or loading here: where the router should send their requests."""
    return {served.name for served in registry.all_models()
            if served.state in (ModelState.READY, ModelState.LOADING)}


async def handle(stack: ReplicaStack, replica_id: str, method: str, path: str,
                 headers: RawHeaders, body: bytes) -> Reply:
    """The standalone server's routing, with the answering replica named in a header."""
    status, payload, reply_headers = await stack.app.handle(method, path, headers, body)
    reply_headers.append((REPLICA_HEADER, replica_id.encode()))
    return status, payload, reply_headers


def _local_root(config: ClusterConfig) -> tuple[Path, RepositoryMirror | None]:
    if not config.is_remote():
        return Path(config.repository.removeprefix("file://")), None
    cache = Path(config.cache_dir) if config.cache_dir else Path(
        tempfile.mkdtemp(prefix="serval-mirror-"))
    return cache, RepositoryMirror(config.repository, cache)


async def _keep_mirrored(mirror: RepositoryMirror, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(mirror.sync)
        except Exception:
            log.exception("repository mirror sync failed; serving what is mirrored")
