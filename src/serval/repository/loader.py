"""Turning one version folder into a served engine: its backend, its manifest checked, room
made under the memory budget, the engine started; at most `max_concurrent_loads` at once.

The registry (repository/registry.py) decides which version loads and when, and owns the
states a failed load leaves; this module only loads. Every model's engine calls share one
thread pool: concurrency is bounded by each batcher's `instances`, threads by the pool's size,
whatever the number of models."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from serval.backends.base import Backend
from serval.errors import ConfigError
from serval.repository.checksums import verify_checksums
from serval.repository.context import VersionContext
from serval.repository.layout import ModelDirectory, version_bytes, version_signature
from serval.repository.memory import MemoryKeeper
from serval.repository.overrides import LoadOverride, version_spec
from serval.repository.response_cache import ResponseCache
from serval.repository.routes import StepRouter
from serval.repository.served import ModelState, ServedModel
from serval.repository.store import verify_version
from serval.stats import Histogram

log = logging.getLogger(__name__)

LOAD_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                  30.0, 60.0)

Source = tuple[ModelDirectory | None, LoadOverride | None]  # where a version loads from
MakeRoom = Callable[[int, ServedModel], Awaitable[None]]  # evicts until the bytes fit


class VersionLoader:
    """Loads versions into READY, counting loads and timing them."""

    def __init__(self, root: Path, backends: Mapping[str, Backend], *, steps: StepRouter,
                 cache: ResponseCache, memory: MemoryKeeper, make_room: MakeRoom,
                 max_concurrent_loads: int, engine_threads: int,
                 clock: Callable[[], int]) -> None:
        self._root = root
        self._backends = backends
        self._steps = steps
        self._cache = cache
        self._memory = memory
        self._make_room = make_room
        self._clock = clock
        self._slots = asyncio.Semaphore(max_concurrent_loads)
        self._engine_pool = ThreadPoolExecutor(engine_threads, thread_name_prefix="engine")
        self.loads = 0
        self.load_seconds = Histogram(LOAD_BUCKETS_S)

    async def load(self, served: ServedModel, source: Source) -> None:
        """Load `served` from `source` (its folder, and the override in force); raises what
        stops it (ModelNotReady: no room now; anything else: the version is broken)."""
        async with self._slots:
            served.state, served.reason = ModelState.LOADING, "loading"
            started_ns = time.perf_counter_ns()
            await self._load_engine(served, source)
            self.load_seconds.observe((time.perf_counter_ns() - started_ns) * 1e-9)

    async def _load_engine(self, served: ServedModel, source: Source) -> None:
        directory, override = source
        if directory is None:
            raise ConfigError(f"{self._root / served.name}: model folder is gone")
        signature = None if override is not None else await asyncio.to_thread(
            version_signature, directory.path, served.version)  # first: later edits show
        spec = await asyncio.to_thread(version_spec, directory, served.version, override)
        if spec.config.response_cache and not self._cache.capacity:
            log.warning("the model enables response_cache but the server has no cache "
                        "(--cache-config local,size=BYTES): its results are not cached",
                        extra={"model": served.name, "version": served.version})
        backend = self._backends.get(spec.config.backend)
        if backend is None:
            raise ConfigError(f"{spec.path}: backend '{spec.config.backend}' is not installed")
        corrupted = await asyncio.to_thread(verify_version, spec.path)
        if corrupted:
            raise ConfigError(f"{spec.path} does not match its manifest: {', '.join(corrupted)}")
        wrong = await asyncio.to_thread(verify_checksums, directory.path,
                                        spec.config.file_checksums)
        if wrong:
            raise ConfigError(f"the checksum agent refuses the load: {'; '.join(wrong)}")
        await self._make_room(version_bytes(spec.path) * spec.config.instances, served)
        serving = await backend.serve(spec, VersionContext(
            served, self._engine_pool, self._steps, override.source if override else str,
            self._cache))
        served.spec, served.model, served.runner = spec, serving.model, serving.runner
        served.signature = signature
        served.memory_bytes = serving.model.memory_bytes()
        served.state, served.reason = ModelState.READY, ""
        served.last_used_ns = self._clock()
        self.loads += 1
        served.load_number = self.loads
        self._cache.forget_composites()  # a pipeline may run on this version now
        self._memory.after_load()
        log.info("model loaded", extra={"model": served.name, "version": served.version,
                                        "bytes": served.memory_bytes})
        await self._make_room(0, served)

    def close(self) -> None:
        """Once every engine is released: stop the engine threads."""
        self._engine_pool.shutdown(wait=True)
