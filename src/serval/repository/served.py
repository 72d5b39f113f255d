"""One model version as the registry tracks it: state, model, runner, pins, memory."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Iterable
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


def least_recently_used_idle(models: Iterable[ServedModel], loading: ServedModel
                             ) -> ServedModel | None:
    """The eviction victim: the ready, idle version used longest ago, other than `loading`
    (None: every loaded version is busy or pinned)."""
    idle = [s for s in models if s.state is ModelState.READY and s.idle and s is not loading]
    return min(idle, key=lambda s: s.last_used_ns, default=None)

class Lease:
    """Pins one model version for the body of an `async with` (no generator per request):
    `pin` finds it ready (loading it where allowed) and counts it in flight."""

    __slots__ = ("_name", "_pin", "_served", "_version")

    def __init__(self, pin: Callable[[str, str | None], Awaitable[ServedModel]], name: str,
                 version: str | None) -> None:
        self._pin, self._name, self._version = pin, name, version
        self._served: ServedModel | None = None

    async def __aenter__(self) -> ServedModel:
        self._served = await self._pin(self._name, self._version)
        return self._served

    async def __aexit__(self, *exc_info: object) -> None:
        if self._served is not None:
            self._served.in_flight -= 1
