"""Metadata from config.yaml for engines whose files do not describe their inputs and outputs."""

from __future__ import annotations

from serval.backends.base import ModelMetadata, ModelVersionSpec
from serval.errors import ConfigError
from serval.model_config import TensorConfig
from serval.protocol.types import TensorSpec


def declared_metadata(spec: ModelVersionSpec, platform: str) -> ModelMetadata:
    """Inputs/outputs as config.yaml declares them; the batch axis (-1) added when batching."""
    config = spec.config
    if not config.inputs or not config.outputs:
        raise ConfigError(f"{spec.path.parent}/config.yaml: backend '{config.backend}' needs "
                          "'inputs' and 'outputs' declared (name, datatype, dims)")
    max_batch_size = config.max_batch_size if config.max_batch_size is not None else 0
    batch = (-1,) if max_batch_size > 0 else ()
    return ModelMetadata(
        platform,
        tuple(_spec(t, batch) for t in config.inputs),
        tuple(_spec(t, batch) for t in config.outputs),
        max_batch_size,
    )


def _spec(tensor: TensorConfig, batch: tuple[int, ...]) -> TensorSpec:
    return TensorSpec(tensor.name, tensor.datatype, (*batch, *tensor.dims), tensor.optional)
