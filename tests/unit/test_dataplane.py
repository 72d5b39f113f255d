"""DataPlane readiness: strict by default (every model that should serve is READY, by model
control), relaxed with strict_readiness=False; model readiness false for what is unknown."""

from __future__ import annotations

import asyncio
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
