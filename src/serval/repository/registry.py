"""Model lifecycle: which versions load (eagerly, lazily, on request), reloads, pins, LRU
eviction by bytes.

The versions themselves, and which one a request reaches, are the table's
(repository/table.py); a load is the loader's (repository/loader.py). Loads run one per version
at a time (concurrent first requests await the same load). Under a memory budget, idle
least-recently-used versions are evicted to make room; a pinned or busy version never is (a
request waiting for a version's load pins it), and a load under way holds its bytes. A
load with an override (repository/overrides.py) loads every selected version afresh beside the
serving ones, which hand over once all are ready; it holds until an unload or a plain load.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from serval.backends.base import Backend
from serval.config import server_default
from serval.errors import ConfigError, LoadFailed, ModelNotFound, ModelNotReady
from serval.model_config import PipelineStep
from serval.repository.layout import scan_model, scan_repository, version_signature
from serval.repository.loader import Source, VersionLoader
from serval.repository.memory import MemoryKeeper
from serval.repository.model_locks import ModelLocks
from serval.repository.names import (
    UNKNOWN_MODEL,
    check_requested_name,
    cut,
    load_error,
    not_ready_message,
)
from serval.repository.overrides import (
    LoadOverride,
    model_directory,
    prepare_override,
    reload_plan,
)
from serval.repository.response_cache import ResponseCache
from serval.repository.routes import StepPath, StepRouter, StreamPath
from serval.repository.served import Lease, ModelState, ServedModel, least_recently_used_idle
from serval.repository.steps import (
    StepNotReady,
    check_no_loop,
    check_step_tensors,
    pipeline_of,
    step_models,
    steps_of,
    steps_while_loading,
)
from serval.repository.table import DEFAULT_CONTROL, ModelControl, ModelTable
from serval.stats import Histogram

log = logging.getLogger(__name__)

class ModelRegistry(ModelTable):
    """Owns every model version; the data plane reaches models only through acquire()."""

    def __init__(
        self,
        root: Path,
        backends: Mapping[str, Backend],
        *,
        control: ModelControl = DEFAULT_CONTROL,
        memory_budget_bytes: int | None = None,
        max_concurrent_loads: int = server_default("max_concurrent_loads"),
        engine_threads: int = 8,
        response_cache_bytes: int = 0,
        retire_timeout_s: float = 30.0,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        super().__init__(root, control)
        self.memory_budget_bytes = memory_budget_bytes
        self._steps = StepRouter()  # the data plane's per-model path, once it routes here
        self._clock = clock
        self._retire_timeout_ns = int(retire_timeout_s * 1e9)
        self._memory = MemoryKeeper()
        self.cache = ResponseCache(response_cache_bytes)  # of models that opt in
        self._loader = VersionLoader(
            root, backends, steps=self._steps, cache=self.cache, memory=self._memory,
            make_room=self._make_room, max_concurrent_loads=max_concurrent_loads,
            engine_threads=engine_threads, clock=clock)
        self._overrides: dict[str, LoadOverride] = {}  # in force until unload or plain load
        self._locks = ModelLocks()  # one API load or unload per model at a time
        self.evictions = 0
        self.hits = 0  # requests that found their model loaded
        self.misses = 0  # requests that waited for a load
        self.indexed_ns = 0  # wall clock when start() began reading the repository

    @property
    def loads(self) -> int:
        return self._loader.loads

    @property
    def load_seconds(self) -> Histogram:
        return self._loader.load_seconds

    # start-up and the repository API ---------------------------------------------------------

    async def start(self) -> None:
        """Index the repository; with control 'all', load every model's served versions."""
        self.indexed_ns = time.time_ns()  # files changed since may have been read before
        for directory in scan_repository(self.root):
            self._track(directory)
        if self.control == "all":
            for name in list(self._models):
                await self._load_versions(name)

    async def load(self, name: str,
                   override: LoadOverride | dict[str, object] | None = None) -> None:
        """(Re)load a model from disk: new versions load and take over, retired ones drain.
        With an override (a dict: a config in either form), or while one is in force, every
        selected version reloads (`_swap`).

        Raises ModelNotFound for a folder that is not there; LoadFailed when a selected version
        is broken, ModelNotReady when one finds no room now (load_error); then nothing is
        retired and the serving versions keep serving.
        """
        if isinstance(override, dict):
            override = prepare_override(name, override, {})
        try:
            check_requested_name(name)
            async with self._locks.hold(name):  # one load or unload of a model at a time
                if override is not None or name in self._overrides:
                    given, override = override, None
                    await self._swap(name, given)  # which owns the override now
                else:
                    await self._load_folder(name)
        finally:
            if override is not None:
                override.discard()

    async def _load_folder(self, name: str) -> None:
        directory = scan_model(self.root, name)
        if directory is None:
            raise ModelNotFound(f"failed to load '{name}': no model folder of that name in the "
                                "repository")
        retired = self._track(directory)
        if not self._selected[name]:
            reasons = "; ".join(s.reason for s in self._models[name].values()) or (
                "the version policy selects no version folder")
            raise LoadFailed(f"failed to load '{name}': nothing to load: {reasons}")
        if await self._changed_on_disk(name):  # as Triton: a changed model reloads
            await self._swap(name, None)
            return
        failed = await self._load_versions(name)
        if failed:  # retire nothing: the versions already serving keep serving
            raise load_error(name, failed)
        for served in retired:
            await self._retire(served, "retired: the version policy no longer selects it")

    async def _changed_on_disk(self, name: str) -> bool:
        """Whether a selected version that serves was loaded from files that changed since."""
        versions = self._models.get(name, {})
        for version in self._selected.get(name, ()):
            served = versions.get(version)
            if served is not None and served.ready and served.signature is not None:
                now = await asyncio.to_thread(version_signature, self.root / name, version)
                if now != served.signature:
                    return True
        return False

    async def _swap(self, name: str, override: LoadOverride | None) -> None:
        """Load every selected version afresh (with the override; None: the folder as it is)
        beside the serving ones; once all are ready they serve and the old ones drain. On a
        failure nothing changes: the serving versions, and their override, keep serving."""
        committed = False
        try:
            fresh, selected = await self._load_fresh(name, override)
            previous = self._overrides.pop(name, None)
            if override is not None:
                self._overrides[name] = override
            committed = True
            await self._hand_over(name, fresh, selected)
            if previous is not None and previous is not override:
                previous.discard()
        finally:
            if not committed and override is not None:
                override.discard()

    async def _load_fresh(self, name: str, override: LoadOverride | None
                          ) -> tuple[list[ServedModel], tuple[str, ...]]:
        directory, selected = await asyncio.to_thread(  # configs parse off the loop
            reload_plan, self.root, name, override, self.public_reason)
        serving = self._models.get(name, {})
        fresh = [ServedModel(name, v, ModelState.UNAVAILABLE, "not loaded", totals=self.totals)
                 for v in selected]
        for served in fresh:
            if served.version in serving:  # one version's counters go on across reloads
                served.stats = serving[served.version].stats
        await asyncio.gather(*(self._load(s, (directory, override)) for s in fresh))
        failed = [s for s in fresh if not s.ready]
        if failed:
            error = load_error(name, failed)
            for served in fresh:
                await self._release(served, ModelState.UNAVAILABLE, "load abandoned")
            raise error
        return fresh, selected

    async def _hand_over(self, name: str, fresh: list[ServedModel],
                         selected: tuple[str, ...]) -> None:
        """Route to the fresh versions, then let the ones they replace drain and go."""
        versions = self._models.setdefault(name, {})
        old = list(versions.values())
        for served in fresh:
            versions[served.version] = served
        self._selected[name] = selected
        for served in old:
            await self._retire(served, "replaced by a reload" if served.version in selected
                               else "retired: the version policy no longer selects it")

    async def unload(self, name: str) -> None:
        """Stop serving every version of a model once its in-flight requests finish; an
        override in force ends with it."""
        versions = self._models.get(name)
        if versions is None:
            raise ModelNotFound(f"{UNKNOWN_MODEL}'{cut(name)}' is not found")
        async with self._locks.hold(name):  # after a reload under way
            for served in list(versions.values()):  # a load may add a version meanwhile
                await self._retire(served, "unloaded")
            override = self._overrides.pop(name, None)
            if override is not None:
                override.discard()

    def route_steps(self, path: StepPath) -> None:
        """The per-model path a composite model (a pipeline) runs its steps through: the data
        plane's own, so a step is validated, batched and counted like a client's request."""
        self._steps.path = path

    def route_streams(self, stream: StreamPath) -> None:
        """How a BLS call with decoupled=True streams the called model's responses."""
        self._steps.stream_path = stream

    # request path ----------------------------------------------------------------------------

    def acquire(self, name: str, version: str | None = None) -> Lease:
        """`async with registry.acquire(...) as served`: a ready model version, loaded on
        demand where allowed, pinned while in use."""
        return Lease(self._pin, name, version)

    async def _pin(self, name: str, version: str | None) -> ServedModel:
        served = self.get(name, version)
        served.in_flight += 1  # pinned while it loads too: no other load evicts it meanwhile
        if served.state is ModelState.READY:
            self.hits += 1
        else:
            self.misses += 1
            try:
                await self._load_on_demand(served, bool(version))
            except BaseException:
                served.in_flight -= 1
                raise
        served.last_used_ns = self._clock()
        return served

    async def drain(self) -> None:
        """Wait until every model's queue is empty and nothing runs."""
        await asyncio.gather(*(s.runner.drain() for s in self.all_models() if s.runner))

    async def close(self) -> None:
        """Stop every batcher and release every engine."""
        for served in self.all_models():
            await self._release(served, ModelState.UNAVAILABLE, "server stopped")
        self._loader.close()
        for override in self._overrides.values():
            override.discard()

    # loading ---------------------------------------------------------------------------------

    async def _load_versions(self, name: str) -> list[ServedModel]:
        """Load every selected version of a model that is not ready; returns those that fail."""
        failed = []
        for version in self._selected.get(name, ()):
            served = self._models[name][version]
            try:
                await self._ensure_loaded(served)
            except ModelNotReady:
                failed.append(served)
        return failed

    async def _load_on_demand(self, served: ServedModel, versioned: bool) -> None:
        if served.state is ModelState.LOADING or served.auto_load:
            await self._ensure_loaded(served)
            return
        raise ModelNotReady(not_ready_message(served, versioned))

    async def _ensure_loaded(self, served: ServedModel) -> None:
        """Load once however many callers wait; ModelNotReady with the reason if it fails."""
        if served.state is ModelState.READY:
            return
        if served.loading is None:
            served.loading = asyncio.ensure_future(self._load(served))
        reason = await asyncio.shield(served.loading)
        if not served.ready:  # the load failed: say why (a later load may be under way now)
            raise ModelNotReady(not_ready_message(served, reason=reason or served.reason))

    async def _load(self, served: ServedModel, source: Source | None = None) -> str:
        """Load from `source`, else from the folder and override the model serves under;
        returns why it failed ('' once READY)."""
        previous, served.broken = served.state, False
        try:
            if source is None:
                override = self._overrides.get(served.name)
                source = model_directory(self.root, served.name, override), override
            await self._load_steps(served, source[1])  # before taking a slot: a step needs its own
            await self._loader.load(served, source)
        except ModelNotReady as exc:  # no room right now: transient, stays loadable
            served.state, served.reason = previous, exc.message
        except Exception as exc:  # clients see the reason without the repository's path
            served.state = ModelState.UNAVAILABLE
            public = exc.public if isinstance(exc, StepNotReady) else str(exc)
            served.reason = f"load failed: {self.public_reason(public)}"
            served.auto_load = False  # a broken version waits for an explicit load
            served.broken = True
            log.error("model failed to load", extra={"model": served.name,
                                                     "version": served.version,
                                                     "reason": str(exc)})
        finally:
            served.loading = None
            self._memory.settle(served)  # a load that failed holds no room
        return "" if served.ready else served.reason

    # pipelines: a composite model serves only while every step's model does -----------------

    async def _load_steps(self, served: ServedModel, override: LoadOverride | None) -> None:
        """Load the models a pipeline's steps run on, so a step that cannot load (a refused
        Python model, a missing model) makes the pipeline UNAVAILABLE with the reason at
        load, not at its first request. StepNotReady naming the step in the log only. The
        steps are those of the config loading (`override`'s), loops checked with them."""
        steps, declared = await asyncio.to_thread(pipeline_of, self.root, served.name, override)
        if not steps:
            return
        served.state, served.reason = ModelState.LOADING, "loading its steps"
        check_no_loop(served.name, steps_while_loading(
            served.name, steps, self._steps_of, lambda name: self._models.get(name, {}).values()))
        for index, step in enumerate(steps, start=1):
            try:
                await self._ensure_loaded(self.get(step.model, step.version))
            except (ModelNotFound, ModelNotReady) as exc:
                raise StepNotReady(f"step {index} ('{step.model}') cannot serve: {exc.message}",
                                   f"step {index} cannot serve: one of its models is not ready "
                                   "(the repository index and the log say why)") from None
        check_step_tensors(served.name, steps, self.get, declared)

    def step_models(self, name: str) -> list[str]:
        """The models a pipeline's steps run on, nested pipelines' too, each once (Triton's
        composing models); [] for any other model."""
        return step_models(name, self._steps_of)

    def _steps_of(self, name: str) -> list[PipelineStep]:
        return steps_of(self.root, name, self._overrides.get(name))

    # memory ----------------------------------------------------------------------------------

    async def _make_room(self, needed_bytes: int, loading: ServedModel) -> None:
        """Evict idle least-recently-used versions until needed_bytes more fit the budget
        beside the bytes held for other loads under way; 0: `loading` is resident now."""
        budget = self.memory_budget_bytes
        self._memory.settle(loading)
        if budget is None:
            return
        if needed_bytes > budget:
            raise ConfigError(f"model '{loading.name}' version {loading.version} needs "
                              f"{needed_bytes} bytes; the memory budget is {budget} bytes")
        while self.resident_bytes + self._memory.reserved(loading) + needed_bytes > budget:
            victim = least_recently_used_idle(self.all_models(), loading)
            if victim is None:
                if needed_bytes == 0:
                    return  # loaded, slightly over budget; the next load will evict
                raise ModelNotReady("the memory budget is full and every loaded model is busy; "
                                    "retry shortly")
            self.evictions += 1
            log.info("model evicted", extra={"model": victim.name, "version": victim.version,
                                             "bytes": victim.memory_bytes})
            await self._release(victim, ModelState.EVICTED, "evicted to fit the memory budget")
            victim.auto_load = True
            self._memory.after_eviction()
        if needed_bytes:
            self._memory.reserve(loading, needed_bytes)

    async def _retire(self, served: ServedModel, reason: str) -> None:
        """Stop routing to a version, let its in-flight requests finish, then release it; a
        load under way finishes first (else it would serve after its unload)."""
        served.auto_load, served.retired = False, True
        if served.loading is not None:
            await asyncio.shield(served.loading)
        if served.state is not ModelState.READY:
            served.state, served.reason = ModelState.UNAVAILABLE, reason
            return
        served.state, served.reason = ModelState.UNAVAILABLE, reason
        if served.runner is not None:
            served.runner.retire()
        # bounded: a model that hangs, or a decoupled stream whose client reads nothing, would
        # hold the unload (and the version's memory) for ever; what still runs then gets 503
        ends_ns = self._clock() + self._retire_timeout_ns
        while served.in_flight and self._clock() < ends_ns:
            await asyncio.sleep(0.005)
        if served.in_flight:
            log.warning("model version released with requests in flight",
                        extra={"model": served.name, "version": served.version,
                               "in_flight": served.in_flight})
        await self._release(served, ModelState.UNAVAILABLE, reason)

    async def _release(self, served: ServedModel, state: ModelState, reason: str) -> None:
        """Mark the version not ready first (new requests go elsewhere), then free it."""
        served.state, served.reason = state, reason
        runner, model = served.runner, served.model
        served.runner, served.model, served.memory_bytes = None, None, 0
        self.cache.release((served.name, served.version, served.load_number))
        self.cache.forget_composites()
        if runner is not None:
            await runner.close()
        if model is not None:
            model.unload()
