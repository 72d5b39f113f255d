"""Validated configuration: per-model config.yaml (ModelConfig) and the server's (ServerConfig)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from serval.errors import ConfigError

MODEL_CONFIG_FILE = "config.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchingConfig(_Strict):
    """How requests are merged into engine batches."""

    max_queue_delay_ms: float = Field(0.0, ge=0.0, le=10_000.0)
    preferred_batch_sizes: list[int] = Field(default_factory=list)

    @field_validator("preferred_batch_sizes")
    @classmethod
    def _positive_sizes(cls, sizes: list[int]) -> list[int]:
        if any(size < 1 for size in sizes):
            raise ValueError("preferred batch sizes must be >= 1")
        return sorted(set(sizes))


class OnnxRuntimeConfig(_Strict):
    """ONNX Runtime session options (None = Serval's core-aware default)."""

    intra_op_threads: int | None = Field(None, ge=1)
    inter_op_threads: int | None = Field(None, ge=1)
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"
    execution_providers: list[str] | None = None
    allow_spinning: bool = False


class ModelConfig(_Strict):
    """What config.yaml beside a model's version directories may say."""

    backend: Literal["onnxruntime"] = "onnxruntime"
    max_batch_size: int | None = Field(
        None, ge=0, description="0 disables batching; None: 64 when the model's batch axis is free"
    )
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    instances: int = Field(1, ge=1, le=64)
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?)$")
    onnxruntime: OnnxRuntimeConfig = Field(default_factory=OnnxRuntimeConfig)


class ServerConfig(_Strict):
    """The running server's settings, from CLI flags."""

    repository: Path
    host: str = "127.0.0.1"
    http_port: int = Field(8000, ge=0, le=65535)
    grpc_port: int = Field(8001, ge=0, le=65535, description="0 disables gRPC")
    grpc_max_message_mb: int = Field(256, ge=1, le=2047)
    workers: int = Field(1, ge=1, le=64)
    log_level: Literal["debug", "info", "warning", "error"] = "info"


def load_model_config(path: Path) -> ModelConfig:
    """Read and validate a config.yaml; a missing file means all defaults."""
    if not path.exists():
        return ModelConfig()
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a YAML mapping of settings")
    try:
        return ModelConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_first_problem(exc)}") from None


def _first_problem(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"]) or "(top level)"
        problems.append(f"field '{field}': {error['msg']}")
    return "; ".join(problems)
