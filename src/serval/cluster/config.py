"""ClusterConfig: the Ray Serve application's arguments (serve config `args`, CLI flags).

Each replica runs the standalone server's stack with the same settings `serval serve` takes
(auth, limits, metrics, timeouts), their defaults read from ServerConfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ByteSize, ConfigDict, Field, ValidationError, model_validator

from serval.config import ServerConfig, TransportLimits, server_default
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
    max_concurrent_loads: int = Field(server_default("max_concurrent_loads"), ge=1, le=64)
    max_inflight: int = Field(server_default("max_inflight"), ge=1)
    default_timeout_ms: float = Field(server_default("default_timeout_ms"), ge=0.0)
    poll_interval_s: float = Field(2.0, ge=0.0, description="repository polling; 0: never")
    retries: int = Field(2, ge=0, le=10, description="ingress retries when a replica dies")
    allow_python_models: bool = server_default("allow_python_models")
    auth_tokens: str | None = Field(None, description="tokens file every node sees: bearer "
                                    "auth when set (serval token create)")
    metrics_top_k: int = Field(server_default("metrics_top_k"), ge=1)
    max_tensor_elements: int = Field(server_default("max_tensor_elements"), ge=1)
    repository_api: bool | None = server_default("repository_api")
    limits: TransportLimits = Field(default_factory=TransportLimits, description="as serve's; "
                                    "through Ray's proxy max_request_bytes applies")
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
        """The standalone settings one replica's stack runs with (models load on demand)."""
        return ServerConfig(
            repository=local_repository, model_control="lazy", memory_budget=self.memory_budget,
            max_concurrent_loads=self.max_concurrent_loads,
            allow_python_models=self.allow_python_models, max_inflight=self.max_inflight,
            default_timeout_ms=self.default_timeout_ms, poll_interval_s=self.poll_interval_s,
            auth_tokens=Path(self.auth_tokens) if self.auth_tokens else None,
            metrics_top_k=self.metrics_top_k, max_tensor_elements=self.max_tensor_elements,
            repository_api=self.repository_api, limits=self.limits,
        )

    def autoscaling(self) -> dict[str, Any] | None:
        """Ray Serve's autoscaling_config, or None with a fixed replica count."""
        if self.num_replicas is not None:
            return None
        return {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "target_ongoing_requests": self.target_ongoing_requests,
                "upscale_delay_s": 3.0, "downscale_delay_s": 60.0}
