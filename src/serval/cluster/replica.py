"""One Serval inside a Ray Serve replica: the standalone server's stack (server/build.py: registry,
data plane, metrics, auth, limits, status sampler, v2 routes) without its listeners."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path

from serval.cluster.config import ClusterConfig
from serval.cluster.mirror import RepositoryMirror
from serval.repository.registry import ModelRegistry
from serval.repository.served import ModelState
from serval.server.build import ServingStack, build_stack, close_stack
from serval.server.http.errors import Reply
from serval.server.http.infer_headers import RawHeaders
from serval.server.http.streamed import StreamedReply, collected

log = logging.getLogger(__name__)

REPLICA_HEADER = b"serval-replica"


ReplicaStack = ServingStack  # what a started replica serves with


async def start_stack(config: ClusterConfig) -> ReplicaStack:
    """Mirror the repository if remote, build the standalone server's stack on it (models
    load lazily), keep the mirror in sync; the stack is ready when returned."""
    root, mirror = _local_root(config)
    if mirror is not None:
        await asyncio.to_thread(mirror.sync)
    stack = await build_stack(config.server_config(root), cores=max(1, int(config.replica_cpus)))
    if mirror is not None and config.poll_interval_s > 0:
        stack.tasks.append(asyncio.create_task(_keep_mirrored(mirror, config.poll_interval_s)))
    stack.dataplane.set_ready(True)
    return stack


async def stop_stack(stack: ReplicaStack) -> None:
    """Finish in-flight requests, then unload every model."""
    await close_stack(stack)


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
    reply = await stack.app.handle(method, path, headers, body)
    if isinstance(reply, StreamedReply):  # Ray's handle answers whole bodies
        reply = await collected(reply)
    status, payload, reply_headers = reply
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
