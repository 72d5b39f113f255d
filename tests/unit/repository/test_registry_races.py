"""ModelRegistry's repository API under hostile or concurrent clients, on a real repository of
small ONNX models: loads of names it lacks, and loads and unloads of one model at once."""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path

import pytest

from serval.backends.onnxruntime import OnnxRuntimeBackend
from serval.errors import ModelNotFound
from serval.repository.registry import ModelRegistry
from tests import fixture_models

pytestmark = pytest.mark.unit


def _registry(root: Path) -> ModelRegistry:
    return ModelRegistry(root, {"onnxruntime": OnnxRuntimeBackend(cores=1)}, control="explicit")


def test_loads_of_names_the_repository_lacks_leave_no_memory_behind(tmp_path: Path) -> None:
    """Each load with a config of a name the repository lacks is a 404 and keeps nothing: the
    registry kept a lock per name ever asked, ~0.5 KB a request for as long as it ran."""
    fixture_models.linear(tmp_path, "m")

    async def refuse(count: int, start: int) -> None:
        for number in range(start, start + count):
            with pytest.raises(ModelNotFound):
                await registry.load(f"{number:0>200}", {"max_batch_size": 4})

    async def main() -> int:
        await registry.start()
        try:
            await refuse(200, 0)  # caches and interned strings settle first
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                await refuse(3000, 200)
                return tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
        finally:
            await registry.close()

    registry = _registry(tmp_path)
    grown = asyncio.run(main())
    assert grown < 200_000, f"3000 refused loads kept {grown} bytes"


def test_loads_and_unloads_of_one_model_at_once_each_answer_as_if_alone(tmp_path: Path) -> None:
    """Clients loading (with and without a config) and unloading one model at once: each call
    runs after the one before it, so every load succeeds and the model's last word holds. A
    plain load ran beside the others and failed with 'replaced by a reload' or 'unloaded'
    while the model served."""
    fixture_models.linear(tmp_path, "m")
    calls = [lambda: registry.load("m"), lambda: registry.load("m", {"max_batch_size": 4}),
             lambda: registry.unload("m"), lambda: registry.load("m", {"max_batch_size": 8})]

    async def main() -> list[BaseException | None]:
        await registry.start()
        try:
            failures: list[BaseException | None] = []
            for round_number in range(60):
                order = calls[round_number % 4:] + calls[:round_number % 4]
                failures += await asyncio.gather(*(call() for call in order),
                                                 return_exceptions=True)
                last = "unloaded" if order[-1] is calls[2] else ""  # READY's reason: none
                assert [entry["reason"] for entry in registry.index()] == [last]
            return [failure for failure in failures if failure is not None]
        finally:
            await registry.close()

    registry = _registry(tmp_path)
    assert asyncio.run(main()) == []
