"""Pipelines: a model made of other models, run step by step by the data plane.

The pipeline itself computes nothing: each step is an ordinary inference on its own model
(so a shared encoder batches across every caller). Loading checks the wiring: each step's
inputs exist when it runs, and every declared output is produced.
"""

from __future__ import annotations

from serval.backends.base import LoadedModel, ModelMetadata, ModelVersionSpec
from serval.backends.declared import declared_metadata
from serval.config import PipelineStep
from serval.errors import ConfigError
from serval.protocol.types import TensorDict


class PipelineBackend:
    name = "pipeline"

    def load(self, spec: ModelVersionSpec) -> LoadedModel:
        metadata = declared_metadata(spec, "ensemble")
        steps = tuple(spec.config.steps)
        if not steps:
            raise ConfigError(f"{spec.path.parent}/config.yaml: a pipeline needs 'steps'")
        check_wiring(steps, metadata, str(spec.path.parent / "config.yaml"))
        return PipelineModel(metadata, steps)


class PipelineModel:
    """The steps and the pipeline's own declared inputs/outputs; the data plane runs it."""

    def __init__(self, metadata: ModelMetadata, steps: tuple[PipelineStep, ...]) -> None:
        self._metadata, self.steps = metadata, steps

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def infer(self, inputs: TensorDict) -> TensorDict:
        raise ConfigError("a pipeline runs through the data plane, step by step")

    def memory_bytes(self) -> int:
        return 0

    def unload(self) -> None:
        return None


def check_wiring(steps: tuple[PipelineStep, ...], metadata: ModelMetadata, where: str) -> None:
    """Every step input is available when the step runs; every output is produced."""
    available = {spec.name for spec in metadata.inputs}
    for index, step in enumerate(steps):
        missing = sorted(set(step.inputs.values()) - available)
        if missing:
            raise ConfigError(f"{where}: step {index + 1} ('{step.model}') reads {missing}, "
                              "which no pipeline input or earlier step provides")
        available |= set(step.outputs.values())
    unproduced = sorted({spec.name for spec in metadata.outputs} - available)
    if unproduced:
        raise ConfigError(f"{where}: pipeline outputs {unproduced} are produced by no step")
