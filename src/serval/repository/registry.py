"""Model lifecycle: which versions load (eagerly, lazily, on request), pins, LRU eviction by bytes.

Every version folder a model's policy selects has a ServedModel entry, loaded or not. Loads run
one per version at a time (concurrent first requests await the same load) and at most
`max_concurrent_loads` at once. Under a memory budget, idle least-recently-used versions are
evicted to make room; a pinned or busy version never is. A version is served by the backend its
config.yaml names, found in the backend table the registry is given (repository/backends.py).
A load with an override (repository/overrides.py) loads every selected version afresh beside the
serving ones, which hand over once all are ready; it holds until an unload or a plain load.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from serval.backends.base import Backend
from serval.config import PipelineStep, server_default
from serval.errors import ConfigError, InvalidInput, ModelNotFound, ModelNotReady
from serval.repository.context import StepPath, StepRouter, VersionContext
from serval.repository.layout import (
    ModelDirectory,
    scan_model,
    scan_repository,
    version_bytes,
    version_signature,
)
from serval.repository.memory import MemoryKeeper
from serval.repository.overrides import (
    LoadOverride,
    model_directory,
    prepare_override,
    reload_plan,
    version_spec,
)
from serval.repository.response_cache import ResponseCache
from serval.repository.served import ModelState, ServedModel
from serval.repository.steps import StepNotReady, check_no_loop, steps_of, unready_steps
from serval.repository.store import serving_version, verify_version
from serval.stats import Histogram, ModelStats

log = logging.getLogger(__name__)

ModelControl = Literal["all", "lazy", "explicit"]
_DEFAULT_CONTROL: ModelControl = server_default("model_control")
LOAD_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                  30.0, 60.0)


Source = tuple[ModelDirectory | None, LoadOverride | None]  # where a version loads from
MAX_NAME_BYTES = 255  # a model name is a folder name: the filesystem's limit
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~-])/[^\s'\"`:,;()\[\]{}<>]+")


UNKNOWN_MODEL = "Request for unknown model: "  # Triton's words, which clients match on


def not_ready_message(served: ServedModel, versioned: bool = True) -> str:
    """Triton's words for a model (version) that is known and not ready, then why."""
    reason = f" ({served.reason})" if served.reason else ""
    if versioned:
        return (f"{UNKNOWN_MODEL}'{served.name}' version {served.version} is not at ready "
                f"state{reason}")
    return (f"{UNKNOWN_MODEL}'{served.name}' has no available versions: version "
            f"{served.version} is {served.state.value}{reason}")


def _last_name(match: re.Match[str]) -> str:
    return match.group(0).rstrip("/").rsplit("/", 1)[-1] or "/"


def check_requested_name(name: str) -> None:
    """InvalidInput for a name no model folder can have (too long, NUL, a path separator)."""
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidInput("a model name must be valid Unicode text (no lone surrogates)") from None
    if size > MAX_NAME_BYTES:
        raise InvalidInput(f"model name of {size} bytes is too long; a model name has at most "
                           f"{MAX_NAME_BYTES} bytes (it is a folder name)")
    if "\x00" in name or "/" in name or "\\" in name:
        raise InvalidInput(f"model name {name!r} may not contain '/', '\\' or NUL; it is one "
                           "folder name in the repository")


class ModelRegistry:
    """Owns every model version; the data plane reaches models only through acquire()."""

    def __init__(
        self,
        root: Path,
        backends: Mapping[str, Backend],
        *,
        control: ModelControl = _DEFAULT_CONTROL,
        memory_budget_bytes: int | None = None,
        max_concurrent_loads: int = server_default("max_concurrent_loads"),
        engine_threads: int = 8,
        response_cache_bytes: int = 0,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self.root = root
        self.control = control
        self.memory_budget_bytes = memory_budget_bytes
        self._backends = backends
        self._steps = StepRouter()  # the data plane's per-model path, once it routes here
        self._clock = clock
        self._load_slots = asyncio.Semaphore(max_concurrent_loads)
        self._memory = MemoryKeeper()
        # Every model's engine calls share this pool: concurrency is bounded by each
        # batcher's `instances`, threads by this size, whatever the number of models.
        self._engine_pool = ThreadPoolExecutor(engine_threads, thread_name_prefix="engine")
        self._models: dict[str, dict[str, ServedModel]] = {}
        self._selected: dict[str, tuple[str, ...]] = {}  # versions each policy serves
        self._overrides: dict[str, LoadOverride] = {}  # in force until unload or plain load
        self._swaps: dict[str, asyncio.Lock] = {}  # one override load per model at a time
        self.loads = 0
        self.evictions = 0
        self.cache = ResponseCache(response_cache_bytes)  # of models that opt in
        self.totals = ModelStats("_all", "")  # every version's metric counters, summed
        self.hits = 0  # requests that found their model loaded
        self.misses = 0  # requests that waited for a load
        self.load_seconds = Histogram(LOAD_BUCKETS_S)

    # start-up and the repository API ---------------------------------------------------------

    async def start(self) -> None:
        """Index the repository; with control 'all', load every model's served versions."""
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

        Raises ModelNotFound for a folder that is not there, ModelNotReady when a selected
        version fails to load; then nothing is retired and the serving versions keep serving.
        """
        if isinstance(override, dict):
            override = prepare_override(name, override, {})
        if override is not None or name in self._overrides:
            await self._swap(name, override)
            return
        check_requested_name(name)
        directory = scan_model(self.root, name)
        if directory is None:
            raise ModelNotFound(f"failed to load '{name}': no model folder of that name in the "
                                "repository")
        retired = self._track(directory)
        if not self._selected[name]:
            reasons = "; ".join(s.reason for s in self._models[name].values()) or (
                "the version policy selects no version folder")
            raise ModelNotReady(f"failed to load '{name}': nothing to load: {reasons}")
        if await self._changed_on_disk(name):  # as Triton: a changed model reloads
            await self._swap(name, None)
            return
        failures = await self._load_versions(name)
        if failures:  # retire nothing: the versions already serving keep serving
            raise ModelNotReady(f"failed to load '{name}': {'; '.join(failures)}")
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
            check_requested_name(name)
            async with self._swaps.setdefault(name, asyncio.Lock()):
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
        directory, selected = reload_plan(self.root, name, override, self.public_reason)
        serving = self._models.get(name, {})
        fresh = [ServedModel(name, v, ModelState.UNAVAILABLE, "not loaded", totals=self.totals)
                 for v in selected]
        for served in fresh:
            if served.version in serving:  # one version's counters go on across reloads
                served.stats = serving[served.version].stats
        await asyncio.gather(*(self._load(s, (directory, override)) for s in fresh))
        failures = [f"version {s.version}: {s.reason}" for s in fresh if not s.ready]
        if failures:
            for served in fresh:
                await self._release(served, ModelState.UNAVAILABLE, "load abandoned")
            raise ModelNotReady(f"failed to load '{name}': {'; '.join(failures)}")
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
            if served.loading is not None:  # a load under way: let it finish, then retire it
                await asyncio.shield(served.loading)
            await self._retire(served, "replaced by a reload" if served.version in selected
                               else "retired: the version policy no longer selects it")

    async def unload(self, name: str) -> None:
        """Stop serving every version of a model once its in-flight requests finish; an
        override in force ends with it."""
        versions = self._models.get(name)
        if versions is None:
            raise ModelNotFound(f"{UNKNOWN_MODEL}'{name}' is not found")
        for served in versions.values():
            await self._retire(served, "unloaded")
        override = self._overrides.pop(name, None)
        if override is not None:
            override.discard()

    def index(self) -> list[dict[str, str]]:
        """Every tracked version: name, version, state and reason (Triton's index format)."""
        return [
            {"name": s.name, "version": s.version, "state": s.state.value, "reason": s.reason}
            for s in self.all_models()
        ]

    def public_reason(self, reason: str) -> str:
        """A failure reason as clients may see it: paths inside the repository relative to it,
        any other filesystem path reduced to its last name (the log keeps the full reason)."""
        root = str(self.root).rstrip("/") + "/"
        return _ABSOLUTE_PATH.sub(_last_name, reason.replace(root, ""))

    def route_steps(self, path: StepPath) -> None:
        """The per-model path a composite model (a pipeline) runs its steps through: the data
        plane's own, so a step is validated, batched and counted like a client's request."""
        self._steps.path = path

    # request path ----------------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> ServedModel:
        """The model version; NotFound if unknown. None: the version an unversioned request
        reaches (the newest ready one, else the newest loadable, else the newest), the one rule
        the request path and the status page share."""
        versions = self._models.get(name)
        if not versions:
            raise ModelNotFound(f"{UNKNOWN_MODEL}'{name}' is not found")
        if not version:  # newest ready, else newest loadable (never a failed one first)
            if len(versions) == 1:
                only = next(iter(versions.values()))
                if only.state is ModelState.READY:
                    return only  # the common case, on every request
            ready = [v for v in versions.values() if v.state is ModelState.READY]
            loadable = [v for v in versions.values()
                        if v.auto_load or v.state is ModelState.LOADING]
            return max(ready or loadable or versions.values(), key=lambda s: int(s.version))
        served = versions.get(version)
        if served is None:
            if not version.isdigit() or int(version) < 1:  # Triton's words
                raise InvalidInput(f"failed to get model version from specified version string "
                                   f"'{version}', version should be an integral value > 0")
            raise ModelNotFound(f"{UNKNOWN_MODEL}'{name}' version {version} is not found; "
                                f"versions: {', '.join(versions)}")
        return served

    def acquire(self, name: str, version: str | None = None) -> Lease:
        """`async with registry.acquire(...) as served`: a ready model version, loaded on
        demand where allowed, pinned while in use."""
        return Lease(self, name, version)

    async def _pin(self, name: str, version: str | None) -> ServedModel:
        served = self.get(name, version)
        if served.state is ModelState.READY:
            self.hits += 1
        else:
            self.misses += 1
            await self._load_on_demand(served, bool(version))
        served.in_flight += 1
        served.last_used_ns = self._clock()
        return served

    def all_models(self) -> list[ServedModel]:
        return [served for versions in self._models.values() for served in versions.values()]

    def versions_of(self, name: str) -> list[str]:
        return sorted(self._models.get(name, {}), key=int)

    def ready_versions(self, name: str) -> list[str]:
        return [v for v in self.versions_of(name)
                if self._models[name][v].state is ModelState.READY]

    @property
    def resident_bytes(self) -> int:
        return sum(s.memory_bytes for s in self.all_models() if s.state is ModelState.READY)

    async def drain(self) -> None:
        """Wait until every model's queue is empty and nothing runs."""
        await asyncio.gather(*(s.runner.drain() for s in self.all_models() if s.runner))

    async def close(self) -> None:
        """Stop every batcher and release every engine."""
        for served in self.all_models():
            await self._release(served, ModelState.UNAVAILABLE, "server stopped")
        self._engine_pool.shutdown(wait=True)
        for override in self._overrides.values():
            override.discard()

    # loading ---------------------------------------------------------------------------------

    def _track(self, directory: ModelDirectory) -> list[ServedModel]:
        """Entries for the versions the policy serves; returns ready ones it no longer serves."""
        name = directory.name
        versions = self._models.setdefault(name, {})
        try:
            policy = directory.config().version_policy
            pinned = serving_version(directory.path)
            selected = (pinned,) if pinned in directory.versions else policy.select(
                directory.versions)
            problem = "" if directory.versions else (
                "the model folder has no version folder (e.g. 1/)")
        except ConfigError as exc:
            selected, problem = directory.versions[-1:], self.public_reason(str(exc))
            log.warning("model config is invalid", extra={"model": name, "reason": str(exc)})
        self._selected[name] = selected
        for version in selected or (("1",) if problem else ()):
            served = versions.get(version)
            if served is None or served.state is ModelState.UNAVAILABLE:
                versions[version] = ServedModel(
                    name, version, ModelState.UNAVAILABLE, problem or "not loaded",
                    auto_load=not problem and self.control == "lazy", totals=self.totals)
        return [s for v, s in versions.items() if v not in selected and s.state is
                ModelState.READY]

    async def _load_versions(self, name: str) -> list[str]:
        """Load every selected version of a model that is not ready; returns failure reasons."""
        failures = []
        for version in self._selected.get(name, ()):
            served = self._models[name][version]
            try:
                await self._ensure_loaded(served)
            except ModelNotReady:
                failures.append(f"version {version}: {served.reason}")
        return failures

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
        await asyncio.shield(served.loading)
        if not served.ready:  # re-read after the await: the load may have failed
            raise ModelNotReady(not_ready_message(served))

    async def _load(self, served: ServedModel, source: Source | None = None) -> None:
        previous = served.state
        try:
            await self._load_steps(served)  # before taking a slot: a step needs its own
            async with self._load_slots:
                served.state, served.reason = ModelState.LOADING, "loading"
                started_ns = time.perf_counter_ns()
                await self._load_engine(served, source)
                self.load_seconds.observe((time.perf_counter_ns() - started_ns) * 1e-9)
        except ModelNotReady as exc:  # no room right now: transient, stays loadable
            served.state, served.reason = previous, exc.message
        except Exception as exc:  # clients see the reason without the repository's path
            served.state = ModelState.UNAVAILABLE
            public = exc.public if isinstance(exc, StepNotReady) else str(exc)
            served.reason = f"load failed: {self.public_reason(public)}"
            served.auto_load = False  # a broken version waits for an explicit load
            log.error("model failed to load", extra={"model": served.name,
                                                     "version": served.version,
                                                     "reason": str(exc)})
        finally:
            served.loading = None

    async def _load_engine(self, served: ServedModel, source: Source | None = None) -> None:
        """Load from `source`, else from the folder and override the model serves under."""
        if source is None:
            override = self._overrides.get(served.name)
            source = model_directory(self.root, served.name, override), override
        directory, override = source
        if directory is None:
            raise ConfigError(f"{self.root / served.name}: model folder is gone")
        signature = None if override is not None else await asyncio.to_thread(
            version_signature, directory.path, served.version)  # first: later edits show
        spec = version_spec(directory, served.version, override)
        if spec.config.response_cache and not self.cache.capacity:
            log.warning("the model enables response_cache but the server has no cache "
                        "(--cache-config local,size=BYTES): its results are not cached",
                        extra={"model": served.name, "version": served.version})
        backend = self._backends.get(spec.config.backend)
        if backend is None:
            raise ConfigError(f"{spec.path}: backend '{spec.config.backend}' is not installed")
        corrupted = await asyncio.to_thread(verify_version, spec.path)
        if corrupted:
            raise ConfigError(f"{spec.path} does not match its manifest: {', '.join(corrupted)}")
        await self._make_room(version_bytes(spec.path) * spec.config.instances, served)
        serving = await backend.serve(spec, VersionContext(served, self._engine_pool,
                                                           self._steps))
        served.spec, served.model, served.runner = spec, serving.model, serving.runner
        served.signature = signature
        served.memory_bytes = serving.model.memory_bytes()
        served.state, served.reason = ModelState.READY, ""
        served.last_used_ns = self._clock()
        self.loads += 1
        served.load_number = self.loads
        self.cache.forget_composites()  # a pipeline may run on this version now
        self._memory.after_load()
        log.info("model loaded", extra={"model": served.name, "version": served.version,
                                        "bytes": served.memory_bytes})
        await self._make_room(0, served)

    # pipelines: a composite model serves only while every step's model does -----------------

    async def _load_steps(self, served: ServedModel) -> None:
        """Load the models a pipeline's steps run on, so a step that cannot load (a refused
        Python model, a missing model) makes the pipeline UNAVAILABLE with the reason at
        load, not at its first request. StepNotReady naming the step in the log only."""
        steps = self._steps_of(served.name)
        if not steps:
            return
        served.state, served.reason = ModelState.LOADING, "loading its steps"
        check_no_loop(served.name, self._steps_of)
        for index, step in enumerate(steps, start=1):
            try:
                await self._ensure_loaded(self.get(step.model, step.version))
            except (ModelNotFound, ModelNotReady) as exc:
                raise StepNotReady(f"step {index} ('{step.model}') cannot serve: {exc.message}",
                                   f"step {index} cannot serve: one of its models is not ready "
                                   "(the repository index and the log say why)") from None

    def unready_steps(self, served: ServedModel) -> list[str]:
        """Why a loaded pipeline cannot serve now ([] for any other model)."""
        return unready_steps(served, self.get)

    def step_models(self, name: str) -> list[str]:
        """The models a pipeline's steps run on, nested pipelines' too, each once (Triton's
        composing models); [] for any other model."""
        found: list[str] = []
        pending = [step.model for step in self._steps_of(name)]
        while pending:
            model = pending.pop(0)
            if model not in found and model != name:
                found.append(model)
                pending += [step.model for step in self._steps_of(model)]
        return found

    def _steps_of(self, name: str) -> list[PipelineStep]:
        return steps_of(self.root, name, self._overrides.get(name))

    # readiness ----------------------------------------------------------------------------------

    def not_serving(self, names: Iterable[str]) -> list[str]:
        """Why these models do not all serve: a model whose policy selects no version, and
        each selected version that is not READY. An evicted version reloads on demand and a
        version loading beside a ready one (a hot swap) still serves, so neither counts; a
        pipeline needs its steps too."""
        problems = []
        for name in names:
            versions = self._models.get(name, {})
            if versions and not self._selected.get(name):  # as Triton: nothing to serve
                reasons = "; ".join(s.reason for s in versions.values())
                problems.append(f"model '{name}' has no version to serve: {reasons}")
                continue
            serving = any(s.state is ModelState.READY for s in versions.values())
            for version in self._selected.get(name, ()):
                served = versions.get(version)
                if served is None or served.state is ModelState.EVICTED or (
                        serving and served.state is ModelState.LOADING):
                    continue
                if served.state is not ModelState.READY:
                    problems.append(f"model '{name}' version {version} is "
                                    f"{served.state.value}: {served.reason}")
                else:
                    problems += [f"model '{name}' {problem}"
                                 for problem in self.unready_steps(served)]
        return problems

    def model_names(self) -> list[str]:
        return list(self._models)

    # memory ----------------------------------------------------------------------------------

    async def _make_room(self, needed_bytes: int, loading: ServedModel) -> None:
        """Evict idle least-recently-used versions until needed_bytes more fit the budget."""
        budget = self.memory_budget_bytes
        if budget is None:
            return
        if needed_bytes > budget:
            raise ConfigError(f"model '{loading.name}' version {loading.version} needs "
                              f"{needed_bytes} bytes; the memory budget is {budget} bytes")
        while self.resident_bytes + needed_bytes > budget:
            victims = [s for s in self.all_models()
                       if s.state is ModelState.READY and s.idle and s is not loading]
            if not victims:
                if needed_bytes == 0:
                    return  # loaded, slightly over budget; the next load will evict
                raise ModelNotReady("the memory budget is full and every loaded model is busy; "
                                    "retry shortly")
            victim = min(victims, key=lambda s: s.last_used_ns)
            self.evictions += 1
            log.info("model evicted", extra={"model": victim.name, "version": victim.version,
                                             "bytes": victim.memory_bytes})
            await self._release(victim, ModelState.EVICTED, "evicted to fit the memory budget")
            victim.auto_load = True
            self._memory.after_eviction()

    async def _retire(self, served: ServedModel, reason: str) -> None:
        """Stop routing to a version, let its in-flight requests finish, then release it."""
        served.auto_load = False
        if served.state is not ModelState.READY:
            served.state, served.reason = ModelState.UNAVAILABLE, reason
            return
        served.state, served.reason = ModelState.UNAVAILABLE, reason
        while served.in_flight:
            await asyncio.sleep(0.005)
        await self._release(served, ModelState.UNAVAILABLE, reason)

    async def _release(self, served: ServedModel, state: ModelState, reason: str) -> None:
        """Mark the version not ready first (new requests go elsewhere), then free it."""
        served.state, served.reason = state, reason
        runner, model = served.runner, served.model
        served.runner, served.model, served.memory_bytes = None, None, 0
        self.cache.forget((served.name, served.version, served.load_number))
        self.cache.forget_composites()
        if runner is not None:
            await runner.close()
        if model is not None:
            model.unload()


class Lease:
    """Pins one model version for the body of an `async with` (no generator per request)."""

    __slots__ = ("_name", "_registry", "_served", "_version")

    def __init__(self, registry: ModelRegistry, name: str, version: str | None) -> None:
        self._registry, self._name, self._version = registry, name, version
        self._served: ServedModel | None = None

    async def __aenter__(self) -> ServedModel:
        self._served = await self._registry._pin(self._name, self._version)
        return self._served

    async def __aexit__(self, *exc_info: object) -> None:
        if self._served is not None:
            self._served.in_flight -= 1
