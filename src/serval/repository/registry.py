"""Model lifecycle: load versions from the repository, serve them through batchers, unload."""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from serval.backends.base import Backend, LoadedModel, ModelVersionSpec
from serval.batching.batcher import Batcher
from serval.errors import ConfigError, ModelNotFound, ModelNotReady
from serval.observability.stats import ModelStats
from serval.repository.layout import scan_repository

log = logging.getLogger(__name__)


class ModelState(enum.Enum):
    READY = "READY"
    LOADING = "LOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(slots=True)
class ServedModel:
    """A model version known to the server: loaded and batching, or why it is not."""

    name: str
    version: str
    state: ModelState
    reason: str = ""
    spec: ModelVersionSpec | None = None
    model: LoadedModel | None = None
    batcher: Batcher | None = None
    stats: ModelStats = field(init=False)
    in_flight: int = 0

    def __post_init__(self) -> None:
        self.stats = ModelStats(self.name, self.version)


class ModelRegistry:
    """Owns every loaded model; the data plane reaches models only through acquire()."""

    def __init__(self, root: Path, backends: dict[str, Backend]) -> None:
        self.root = root
        self._backends = backends
        self._models: dict[str, dict[str, ServedModel]] = {}

    async def load_all(self) -> None:
        """Load the latest version of every model; one failure never stops the others."""
        for directory in scan_repository(self.root):
            version = directory.versions[-1] if directory.versions else "1"
            served = ServedModel(directory.name, version, ModelState.LOADING)
            self._models[directory.name] = {version: served}
            try:
                spec = directory.latest_spec()
                await self._load(served, spec)
            except Exception as exc:
                self._mark_failed(served, exc)

    async def _load(self, served: ServedModel, spec: ModelVersionSpec) -> None:
        backend = self._backends.get(spec.config.backend)
        if backend is None:
            raise ConfigError(f"{spec.path}: backend '{spec.config.backend}' is not installed")
        model = await asyncio.to_thread(backend.load, spec)
        served.spec, served.model = spec, model
        served.batcher = Batcher(
            model,
            served.stats,
            instances=spec.config.instances,
            max_queue_delay_ms=spec.config.batching.max_queue_delay_ms,
        )
        served.state, served.reason = ModelState.READY, ""
        log.info("model loaded", extra={"model": served.name, "version": served.version})

    def _mark_failed(self, served: ServedModel, exc: Exception) -> None:
        served.state = ModelState.UNAVAILABLE
        served.reason = f"load failed: {exc}"
        log.error(
            "model failed to load",
            extra={"model": served.name, "version": served.version, "reason": str(exc)},
        )

    def get(self, name: str, version: str | None = None) -> ServedModel:
        """The model version (latest when version is None); NotFound for unknown names."""
        versions = self._models.get(name)
        if versions is None:
            raise ModelNotFound(f"unknown model '{name}'")
        if version is None or version == "":
            return versions[max(versions, key=int)]
        served = versions.get(version)
        if served is None:
            raise ModelNotFound(
                f"model '{name}' has no version '{version}'; versions: {', '.join(versions)}"
            )
        return served

    @asynccontextmanager
    async def acquire(self, name: str, version: str | None = None) -> AsyncIterator[ServedModel]:
        """A ready model, pinned while the caller uses it."""
        served = self.get(name, version)
        if served.state is not ModelState.READY:
            reason = f": {served.reason}" if served.reason else ""
            raise ModelNotReady(f"model '{name}' version {served.version} is not ready{reason}")
        served.in_flight += 1
        try:
            yield served
        finally:
            served.in_flight -= 1

    def all_models(self) -> list[ServedModel]:
        return [served for versions in self._models.values() for served in versions.values()]

    def versions_of(self, name: str) -> list[str]:
        return sorted(self._models.get(name, {}), key=int)

    async def drain(self) -> None:
        """Wait until every model's queue is empty and nothing runs."""
        await asyncio.gather(*(s.batcher.drain() for s in self.all_models() if s.batcher))

    async def close(self) -> None:
        """Stop every batcher and release every engine."""
        for served in self.all_models():
            if served.batcher is not None:
                await served.batcher.close()
            if served.model is not None:
                served.model.unload()
            served.state, served.batcher, served.model = ModelState.UNAVAILABLE, None, None
