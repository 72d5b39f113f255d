"""One model version as the registry tracks it: state, model, runner, pins, memory."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from serval.backends.base import Model, ModelVersionSpec, Runner
from serval.batching.sequencer import Sequencer
from serval.repository.layout import VersionSignature
from serval.stats import ModelStats


class ModelState(enum.Enum):
    READY = "READY"
    LOADING = "LOADING"
    UNAVAILABLE = "UNAVAILABLE"
    EVICTED = "EVICTED"


@dataclass(slots=True, eq=False)
class ServedModel:
    """A model version known to the server: loaded and served by its runner (a batcher over
    an engine, or a pipeline over its steps), or why it is not."""

    name: str
    version: str
    state: ModelState
    reason: str = ""
    spec: ModelVersionSpec | None = None
    model: Model | None = None
    runner: Runner | None = None
    stats: ModelStats = field(init=False)
    in_flight: int = 0
    last_used_ns: int = 0
    memory_bytes: int = 0
    load_number: int = 0  # which of the registry's loads this is (response cache scopes)
    signature: VersionSignature | None = None  # its files at load (None: an override's)
    loading: asyncio.Task[str] | None = None  # its load under way: why it failed ('' if not)
    auto_load: bool = False  # may load on a request (lazy control, or evicted)
    broken: bool = False  # its last load failed on its files or config, not for want of room
    retired: bool = False  # unloaded or replaced: never serves again (a load makes a new one)
    totals: ModelStats | None = None  # the registry's server-wide sums

    def __post_init__(self) -> None:
        self.stats = ModelStats(self.name, self.version, self.totals)

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    @property
    def pending_requests(self) -> int:
        return self.runner.queued if self.runner else 0

    @property
    def running_batches(self) -> int:
        return self.runner.running if self.runner else 0

    @property
    def idle(self) -> bool:
        """Nothing pinned, queued or computing, and no live sequence (its state would go with
        the engine, until it ends or idles out): safe to evict."""
        runner = self.runner
        busy = runner is not None and bool(runner.queued or runner.running or (
            isinstance(runner, Sequencer) and runner.live_sequences))
        return self.in_flight == 0 and not busy
