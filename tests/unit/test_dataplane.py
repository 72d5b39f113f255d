"""DataPlane readiness: strict by default (every model that should serve is READY, by model
control), relaxed with strict_readiness=False; model readiness false for what is unknown."""

from __future__ import annotations

import asyncio
import logging
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from serval.backends.onnxruntime import OnnxRuntimeBackend
from serval.dataplane import DataPlane
from serval.errors import LoadFailed, ModelNotReady
from serval.repository.registry import ModelRegistry
from serval.repository.table import ModelControl
from tests import fixture_models

pytestmark = pytest.mark.unit

Check = Callable[[DataPlane], Awaitable[None]]


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    fixture_models.linear(tmp_path)
    fixture_models.corrupt(tmp_path)
    return tmp_path


def _run(root: Path, control: ModelControl, check: Check, strict: bool = True) -> None:
    async def main() -> None:
        registry = ModelRegistry(root, {"onnxruntime": OnnxRuntimeBackend(cores=1)},
                                 control=control)
        try:
            await registry.start()
            dataplane = DataPlane(registry, repository_api=True, strict_readiness=strict)
            assert "starting" in dataplane.not_ready_reason() and not dataplane.ready()
            dataplane.set_ready(True)
            await check(dataplane)
        finally:
            await registry.close()

    asyncio.run(main())


def test_control_all_is_not_ready_while_a_model_is_unavailable(repository: Path) -> None:
    async def strict(dataplane: DataPlane) -> None:
        assert not dataplane.ready()
        assert "1 model version(s) that should serve" in dataplane.not_ready_reason()
        assert "corrupt" not in dataplane.not_ready_reason()  # the probe is open to anyone
        await dataplane.unload_model("corrupt")  # unloaded on purpose: it need not serve
        assert dataplane.ready()

    async def relaxed(dataplane: DataPlane) -> None:
        assert dataplane.ready()

    _run(repository, "all", strict)
    _run(repository, "all", relaxed, strict=False)


def test_explicit_control_counts_the_models_asked_for(repository: Path) -> None:
    async def check(dataplane: DataPlane) -> None:
        assert dataplane.ready()  # nothing asked for
        await dataplane.load_model("linear")
        assert dataplane.ready()
        with pytest.raises(LoadFailed, match="failed to load 'corrupt'"):
            await dataplane.load_model("corrupt")
        assert not dataplane.ready()
        await dataplane.unload_model("corrupt")
        assert dataplane.ready()

    _run(repository, "explicit", check)


def test_lazy_control_never_holds_readiness_on_a_model(repository: Path) -> None:
    async def check(dataplane: DataPlane) -> None:
        with pytest.raises(ModelNotReady, match="load failed"):
            async with dataplane.registry.acquire("corrupt"):
                pass
        assert dataplane.ready()
        with pytest.raises(LoadFailed):
            await dataplane.load_model("corrupt")
        assert dataplane.ready()  # a lazy node stays in its balancer's rotation

    _run(repository, "lazy", check)


def test_model_readiness_is_false_for_unknown_models_and_versions(repository: Path) -> None:
    async def check(dataplane: DataPlane) -> None:
        assert dataplane.model_ready("linear") and dataplane.model_ready("linear", "1")
        assert not dataplane.model_ready("linear", "99")
        assert not dataplane.model_ready("nope") and not dataplane.model_ready("corrupt")

    _run(repository, "all", check)


def test_failed_loads_of_new_names_from_files_leave_no_memory_behind(
        repository: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A load of a name the repository lacks, from files that fail to load, is the client's
    400 and keeps nothing: the name was kept as one that should serve, ~0.6 KB a request for
    as long as the server ran (though no such model exists to serve)."""
    garbage = {"file:1/model.onnx": b"not an onnx model"}
    # each failure's log record would be kept by pytest's log capture, not by the server
    monkeypatch.setattr(logging.getLogger("serval.repository.registry"), "disabled", True)

    async def refuse(dataplane: DataPlane, count: int, start: int) -> None:
        for number in range(start, start + count):
            with pytest.raises(LoadFailed):
                await dataplane.load_model(f"{number:0>200}", "{}", garbage)

    async def check(dataplane: DataPlane) -> None:
        await refuse(dataplane, 100, 0)  # caches and interned strings settle first
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            await refuse(dataplane, 1000, 100)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        # ~600 KB when each kept its name; allocator and tracemalloc noise is up to ~160 KB
        assert grown < 300_000, f"1000 refused loads kept {grown} bytes"
        assert dataplane.ready()

    _run(repository, "explicit", check)
