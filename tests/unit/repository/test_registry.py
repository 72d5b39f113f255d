"""ModelRegistry over a real repository of small ONNX models with an injected clock: LRU
eviction order, pinning, single-flight loads, eviction by bytes against the memory budget, and
a retired version draining after a swap."""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from serval.backends.base import LoadedModel, ModelVersionSpec
from serval.backends.engine import EngineBackend
from serval.backends.onnxruntime import OnnxRuntimeBackend
from serval.errors import ModelNotReady
from serval.repository.layout import version_bytes
from serval.repository.registry import ModelRegistry
from serval.repository.served import ModelState
from serval.repository.table import ModelControl
from tests import fixture_models

pytestmark = pytest.mark.unit


# --- lifecycle on real ONNX Runtime, under an injected clock -----------------------------------


class Clock:
    """The registry's injected clock: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns

    def at(self, seconds: float) -> None:
        self.now_ns = int(seconds * 1e9)


class CountingBackend(EngineBackend):
    """The real ONNX Runtime backend, counting its loads per model; the load of a model in
    `held` waits (in its loader thread) until `release` is set, with `holding` set meanwhile."""

    name = "onnxruntime"

    def __init__(self, held: frozenset[str] = frozenset()) -> None:
        self.engine = OnnxRuntimeBackend(cores=1)
        self.loads: Counter[str] = Counter()
        self.held = held
        self.holding = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def load(self, spec: ModelVersionSpec) -> LoadedModel:
        with self._lock:
            self.loads[spec.name] += 1
        if spec.name in self.held:
            self.holding.set()
            assert self.release.wait(timeout=10), "the test never released the load"
        return self.engine.load(spec)


def _registry(root: Path, clock: Clock, backend: CountingBackend | None = None,
              budget_bytes: int | None = None, control: ModelControl = "lazy") -> ModelRegistry:
    return ModelRegistry(root, {"onnxruntime": backend or CountingBackend()}, control=control,
                         memory_budget_bytes=budget_bytes, clock=clock)


def _resident_bytes(root: Path) -> dict[str, int]:
    """What each model of `root` occupies once loaded, from a registry without a budget."""

    async def main() -> dict[str, int]:
        registry = _registry(root, Clock(), control="all")
        try:
            await registry.start()
            return {s.name: s.memory_bytes for s in registry.all_models()}
        finally:
            await registry.close()

    return asyncio.run(main())


async def _use(registry: ModelRegistry, clock: Clock, name: str, at_s: float) -> None:
    """One request to `name` at time `at_s`: two rows through its runner (batcher) and engine."""
    clock.at(at_s)
    async with registry.acquire(name) as served:
        assert served.runner is not None and served.model is not None
        (given,) = served.model.metadata.inputs
        rows = np.linspace(0, 1, 2 * given.shape[1], dtype=np.float32).reshape(2, -1)
        outputs = await served.runner.infer({given.name: rows})
    assert [len(output) for output in outputs.values()] == [2]


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        await asyncio.sleep(0.001)


def _states(registry: ModelRegistry) -> dict[str, str]:
    return {f"{s.name}/{s.version}": s.state.value for s in registry.all_models()}



@pytest.fixture
def three(tmp_path: Path) -> Path:
    """A repository of three identical small models: a, b and c."""
    root = tmp_path / "models"
    for name in ("a", "b", "c"):
        fixture_models.linear(root, name)
    return root


def test_the_least_recently_used_idle_version_is_evicted_first(three: Path) -> None:
    size = _resident_bytes(three)["a"]
    clock = Clock()

    async def main() -> list[dict[str, str]]:
        registry = _registry(three, clock, budget_bytes=2 * size + size // 2)  # room for two
        try:
            await registry.start()
            seen = []
            await _use(registry, clock, "a", 1)
            await _use(registry, clock, "b", 2)
            await _use(registry, clock, "a", 3)  # b is now the least recently used
            await _use(registry, clock, "c", 4)
            seen.append(_states(registry))
            await _use(registry, clock, "b", 5)  # a (used at 3) goes before c (used at 4)
            seen.append(_states(registry))
            assert registry.resident_bytes <= 2 * size + size // 2
            assert (registry.loads, registry.evictions) == (4, 2)
            return seen
        finally:
            await registry.close()

    after_c, after_b = asyncio.run(main())
    assert after_c == {"a/1": "READY", "b/1": "EVICTED", "c/1": "READY"}
    assert after_b == {"a/1": "EVICTED", "b/1": "READY", "c/1": "READY"}


def test_a_pinned_version_is_never_evicted_however_old(three: Path) -> None:
    size = _resident_bytes(three)["a"]
    file_bytes = version_bytes(three / "b" / "1")  # what a load must find room for first
    clock = Clock()

    async def main() -> None:
        registry = _registry(three, clock, budget_bytes=2 * size + file_bytes // 2)
        try:
            await registry.start()
            clock.at(1)
            async with registry.acquire("a"):  # a: the oldest, but pinned by a request
                await _use(registry, clock, "b", 2)
                await _use(registry, clock, "c", 3)
                assert _states(registry) == {"a/1": "READY", "b/1": "EVICTED", "c/1": "READY"}
                clock.at(4)
                async with registry.acquire("c"):  # both pinned: no room for b
                    with pytest.raises(ModelNotReady, match="every loaded model is busy"):
                        await _use(registry, clock, "b", 5)
                assert _states(registry)["b/1"] == "EVICTED"  # still loadable, not failed
            await _use(registry, clock, "b", 6)  # a unpinned: now it is the one to go
            assert _states(registry) == {"a/1": "EVICTED", "b/1": "READY", "c/1": "READY"}
        finally:
            await registry.close()

    asyncio.run(main())


def test_concurrent_requests_for_an_unloaded_model_load_it_once(three: Path) -> None:
    backend = CountingBackend(held=frozenset({"a"}))
    clock = Clock()

    async def main() -> None:
        registry = _registry(three, clock, backend)
        try:
            await registry.start()
            requests = [asyncio.create_task(_use(registry, clock, "a", 1)) for _ in range(8)]
            await asyncio.to_thread(backend.holding.wait, 10)  # a's engine load has begun
            await _until(lambda: registry.misses == 8)  # and every request waits for it
            # another model loads meanwhile: one load per model, not one for the registry
            await asyncio.wait_for(_use(registry, clock, "b", 2), 10)
            assert not any(r.done() for r in requests)
            backend.release.set()
            await asyncio.wait_for(asyncio.gather(*requests), 10)
            assert backend.loads == {"a": 1, "b": 1} and registry.loads == 2
            assert (registry.hits, registry.misses) == (0, 9)
            await _use(registry, clock, "a", 3)  # loaded: a hit, no load
            assert backend.loads["a"] == 1 and registry.hits == 1
        finally:
            backend.release.set()
            await registry.close()

    asyncio.run(main())


def test_eviction_frees_bytes_not_a_count_of_models(tmp_path: Path) -> None:
    root = tmp_path / "models"
    smalls = ("a", "b", "c", "d")
    for name in smalls:
        fixture_models.linear(root, name)
    fixture_models.heavy(root, "big", layers=1, width=480)  # ~900 KB of weights
    sizes = _resident_bytes(root)
    small, big = sizes["a"], sizes["big"]
    budget = 4 * small + small // 2  # room for the four small ones
    assert small + big <= budget < 2 * small + big  # so big leaves room for one of them
    clock = Clock()

    async def main() -> dict[str, str]:
        registry = _registry(root, clock, budget_bytes=budget)
        try:
            await registry.start()
            for second, name in enumerate(smalls):
                await _use(registry, clock, name, second)
            assert registry.evictions == 0
            await _use(registry, clock, "big", 5)
            assert registry.resident_bytes == small + big <= budget
            assert registry.evictions == 3
            return _states(registry)
        finally:
            await registry.close()

    assert asyncio.run(main()) == {"a/1": "EVICTED", "b/1": "EVICTED", "c/1": "EVICTED",
                                   "d/1": "READY", "big/1": "READY"}


def test_a_version_larger_than_the_whole_budget_fails_without_evicting(three: Path) -> None:
    fixture_models.heavy(three, "huge", layers=2, width=512)
    size = _resident_bytes(three)["a"]
    clock = Clock()

    async def main() -> None:
        registry = _registry(three, clock, budget_bytes=2 * size + size // 2)
        try:
            await registry.start()
            await _use(registry, clock, "a", 1)
            await _use(registry, clock, "b", 2)
            with pytest.raises(ModelNotReady, match=r"needs \d+ bytes; the memory budget is"):
                async with registry.acquire("huge"):
                    pass
            assert registry.evictions == 0
            assert _states(registry) == {"a/1": "READY", "b/1": "READY", "c/1": "UNAVAILABLE",
                                         "huge/1": "UNAVAILABLE"}
        finally:
            await registry.close()

    asyncio.run(main())


def test_a_retired_version_finishes_its_in_flight_work_after_a_swap(tmp_path: Path) -> None:
    root = tmp_path / "models"
    fixture_models.linear(root, "m", seed=0)
    fixture_models.linear(tmp_path / "next", "m", seed=1)
    rows = np.arange(16, dtype=np.float32).reshape(2, 8) / 16
    clock = Clock()

    async def main() -> None:
        registry = _registry(root, clock, control="all")
        try:
            await registry.start()
            clock.at(1)
            async with registry.acquire("m") as old:
                assert old.version == "1" and old.runner is not None
                before = await old.runner.infer({"x": rows})
                shutil.copytree(tmp_path / "next" / "m" / "1", root / "m" / "2")
                swap = asyncio.create_task(registry.load("m"))  # latest 1: 2 replaces 1
                await _until(lambda: old.reason.startswith("retired"))
                assert registry.get("m").version == "2"  # new requests reach version 2
                async with registry.acquire("m") as new:
                    assert new.version == "2" and new.runner is not None
                    fresh = await new.runner.infer({"x": rows})
                assert not np.allclose(fresh["probabilities"], before["probabilities"])
                assert not swap.done() and old.model is not None  # 1 waits for its request
                again = await old.runner.infer({"x": rows})  # which still computes on 1
                np.testing.assert_array_equal(again["probabilities"], before["probabilities"])
            await asyncio.wait_for(swap, 10)
            assert (old.state, old.model, old.runner) == (ModelState.UNAVAILABLE, None, None)
            assert _states(registry) == {"m/1": "UNAVAILABLE", "m/2": "READY"}
        finally:
            await registry.close()

    asyncio.run(main())
