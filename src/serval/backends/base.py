"""What every engine provides: load a model version, describe it, run a batch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from serval.config import ModelConfig
from serval.errors import ConfigError
from serval.protocol.types import TensorDict, TensorSpec


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """What a loaded model accepts and returns; max_batch_size 0 means no batch axis."""

    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int


@dataclass(frozen=True, slots=True)
class ModelVersionSpec:
    """A model version on disk, as the repository found it."""

    name: str
    version: str
    path: Path
    config: ModelConfig


class LoadedModel(Protocol):
    """A model ready to run; infer is synchronous, batch-first, and thread safe."""

    @property
    def metadata(self) -> ModelMetadata: ...

    def infer(self, inputs: TensorDict) -> TensorDict: ...

    def memory_bytes(self) -> int: ...

    def unload(self) -> None: ...


class Backend(Protocol):
    """An engine able to load the model files of one format."""

    name: str

    def load(self, spec: ModelVersionSpec) -> LoadedModel: ...


DEFAULT_MAX_BATCH_SIZE = 64


def resolve_max_batch_size(configured: int | None, tensors: tuple[TensorSpec, ...],
                           source: str) -> int:
    """The config's max_batch_size, else 64 when every tensor's first axis is free, else 0."""
    batchable = all(spec.shape and spec.shape[0] == -1 for spec in tensors)
    if configured is None:
        return DEFAULT_MAX_BATCH_SIZE if batchable else 0
    if configured > 0 and not batchable:
        raise ConfigError(f"{source}: max_batch_size is {configured} but not every input and "
                          "output has a free first (batch) dimension")
    return configured
