"""ModelRegistry's part in readiness: which versions do not serve (not_serving), and pipelines
that load their steps' models first, UNAVAILABLE with a reason when a step cannot serve."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from serval.backends.onnxruntime import OnnxRuntimeBackend
from serval.backends.pipeline import PipelineBackend
from serval.repository.registry import ModelRegistry
from serval.repository.served import ModelState
from serval.repository.table import ModelControl
from tests import fixture_models

pytestmark = pytest.mark.unit

PIPELINE = """\
backend: pipeline
max_batch_size: 8
inputs:
  - {{name: x, datatype: FP32, dims: [8]}}
outputs:
  - {{name: p, datatype: FP32, dims: [4]}}
steps:
  - model: {step}
    inputs: {{x: x}}
    outputs: {{probabilities: p}}
"""


def _pipeline(root: Path, name: str, step: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.yaml").write_text(PIPELINE.format(step=step))


def _registry(root: Path, control: ModelControl = "all") -> ModelRegistry:
    backends = {"onnxruntime": OnnxRuntimeBackend(cores=1), "pipeline": PipelineBackend()}
    return ModelRegistry(root, backends, control=control)


def _run(root: Path, check: Callable[[ModelRegistry], Awaitable[None]],
         control: ModelControl = "all") -> None:
    async def main() -> None:
        registry = _registry(root, control)
        try:
            await registry.start()
            await check(registry)
        finally:
            await registry.close()

    asyncio.run(main())


def test_a_failed_version_does_not_serve_and_an_evicted_one_does(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    fixture_models.corrupt(tmp_path)

    async def check(registry: ModelRegistry) -> None:
        (problem,) = registry.not_serving(["linear", "corrupt"])
        assert problem.startswith("model 'corrupt' version 1 is UNAVAILABLE: load failed")
        registry.get("linear").state = ModelState.EVICTED  # reloads on its next request
        assert registry.not_serving(["linear"]) == []
        assert registry.not_serving(["unknown"]) == []

    _run(tmp_path, check)


def test_a_model_with_no_version_to_serve_does_not_serve(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()

    async def check(registry: ModelRegistry) -> None:
        (problem,) = registry.not_serving(["empty"])
        assert problem.startswith("model 'empty' has no version to serve")

    _run(tmp_path, check)


def test_a_pipeline_loads_its_steps_and_serves_while_they_do(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    _pipeline(tmp_path, "chain", "linear")

    async def check(registry: ModelRegistry) -> None:
        chain = registry.get("chain")
        assert chain.state is ModelState.READY and registry.get("linear").ready
        assert registry.unready_steps(chain) == []
        await registry.unload("linear")
        (problem,) = registry.unready_steps(chain)
        assert problem.startswith("step 1 ('linear'): version 1 is UNAVAILABLE")
        assert registry.not_serving(["chain"]) == [f"model 'chain' {problem}"]

    _run(tmp_path, check)

    async def explicit(registry: ModelRegistry) -> None:
        assert not registry.get("linear").ready  # nothing loads at start ...
        await registry.load("chain")  # ... and loading the pipeline loads its step
        assert registry.get("linear").ready

    _run(tmp_path, explicit, control="explicit")


def test_a_pipeline_whose_step_cannot_serve_is_unavailable_without_naming_it(
        tmp_path: Path) -> None:
    _pipeline(tmp_path, "chain", "hidden_step")

    async def check(registry: ModelRegistry) -> None:
        chain = registry.get("chain")
        assert chain.state is ModelState.UNAVAILABLE
        assert chain.reason == ("load failed: step 1 cannot serve: one of its models is not "
                                "ready (the repository index and the log say why)")

    _run(tmp_path, check)


def test_pipelines_that_loop_fail_to_load(tmp_path: Path) -> None:
    _pipeline(tmp_path, "a", "b")
    _pipeline(tmp_path, "b", "a")

    async def check(registry: ModelRegistry) -> None:
        assert {s.state for s in registry.all_models()} == {ModelState.UNAVAILABLE}

    _run(tmp_path, check)
