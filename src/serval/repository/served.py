"""One model version as the registry tracks it: state, engine, batcher, pins, memory."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from serval.backends.base import LoadedModel, ModelVersionSpec
from serval.batching.batcher import Batcher
from serval.stats import ModelStats


class ModelState(enum.Enum):
    READY = "READY"
    LOADING = "LOADING"
    UNAVAILABLE = "UNAVAILABLE"
    EVICTED = "EVICTED"


@dataclass(slots=True, eq=False)
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
    last_used_ns: int = 0
    memory_bytes: int = 0
    loading: asyncio.Task[None] | None = None
    auto_load: bool = False  # may load on a request (lazy control, or evicted)
    totals: ModelStats | None = None  # the registry's server-wide sums

    def __post_init__(self) -> None:
        self.stats = ModelStats(self.name, self.version, self.totals)

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    @property
    def pending_requests(self) -> int:
        return self.batcher.queued if self.batcher else 0

    @property
    def running_batches(self) -> int:
        return self.batcher.running if self.batcher else 0

    @property
    def idle(self) -> bool:
        """Nothing pinned, queued or computing: safe to evict or unload."""
        busy = self.batcher is not None and (self.batcher.queued or self.batcher.running)
        return self.in_flight == 0 and not busy
