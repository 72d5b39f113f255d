"""ClusterConfig: the Ray Serve application's arguments (serve config `args`, CLI flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError, model_validator

from serval.config import ServerConfig
from serval.errors import ConfigError


class ClusterConfig(BaseModel):
    """How the Serval application runs on Ray Serve: repository, replicas, budgets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repository: str = Field(min_length=1, description="a path every node sees, or an fsspec URL")
    memory_budget: ByteSize | None = Field(
        None, description="per replica: evict least-recently-used idle models beyond this")
    num_replicas: int | None = Field(None, ge=1, description="fixed count (no autoscaling)")
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(4, ge=1)
    target_ongoing_requests: float = Field(32.0, gt=0.0)
    max_ongoing_requests: int = Field(256, ge=1, description="per replica; queued at the router")
    replica_cpus: float = Field(1.0, gt=0.0, description="CPUs Ray reserves for each replica")
    ingress: bool = Field(True, description="false: Ray's proxy calls replicas directly "
                          "(placement only for clients sending serve_multiplexed_model_id)")
    ingress_replicas: int = Field(1, ge=1)
    max_concurrent_loads: int = Field(2, ge=1, le=64)
    max_inflight: int = Field(4096, ge=1)
    default_timeout_ms: float = Field(0.0, ge=0.0)
    poll_interval_s: float = Field(2.0, ge=0.0, description="repository polling; 0: never")
    retries: int = Field(2, ge=0, le=10, description="ingress retries when a replica dies")
    allow_python_models: bool = False
    cache_dir: str = Field("", description="local mirror of a remote repository; '' = a temp dir")
    log_level: str = "warning"

    @model_validator(mode="after")
    def _bounds(self) -> ClusterConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        return self

    @classmethod
    def parse(cls, args: dict[str, Any]) -> ClusterConfig:
        """Validate serve-config or CLI arguments; a ConfigError names the bad field."""
        try:
            return cls.model_validate(args)
        except ValidationError as exc:
            problem = exc.errors()[0]
            field = ".".join(str(part) for part in problem["loc"]) or "(top level)"
            raise ConfigError(f"cluster config field '{field}': {problem['msg']}") from None

    def is_remote(self) -> bool:
        """True for an fsspec URL other than file://."""
        return "://" in self.repository and not self.repository.startswith("file://")

    def server_config(self, local_repository: Path) -> ServerConfig:
        """The standalone settings one replica's data plane runs with."""
        return ServerConfig(
            repository=local_repository, model_control="lazy", memory_budget=self.memory_budget,
            max_concurrent_loads=self.max_concurrent_loads,
            allow_python_models=self.allow_python_models, max_inflight=self.max_inflight,
            default_timeout_ms=self.default_timeout_ms, poll_interval_s=self.poll_interval_s,
        )

    def autoscaling(self) -> dict[str, Any] | None:
        """Ray Serve's autoscaling_config, or None with a fixed replica count."""
        if self.num_replicas is not None:
            return None
        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "target_ongoing_requests": self.target_ongoing_requests,
                "upscale_delay_s": 3.0, "downscale_delay_s": 60.0}
