"""ClusterConfig: validation that names the field, autoscaling bounds, the replicas' server
config."""

from __future__ import annotations

from pathlib import Path

import pytest

from serval.cluster.config import ClusterConfig
from serval.config import ServerConfig, TransportLimits
from serval.errors import ConfigError

pytestmark = pytest.mark.unit


def test_autoscaling_bounds_map_to_ray_serve() -> None:
    config = ClusterConfig.parse({"repository": "/m", "min_replicas": 2, "max_replicas": 6,
                                  "target_ongoing_requests": 16})
    assert config.autoscaling() == {"min_replicas": 2, "max_replicas": 6,
                                    "target_ongoing_requests": 16.0, "upscale_delay_s": 3.0,
                                    "downscale_delay_s": 60.0}
    assert ClusterConfig.parse({"repository": "/m", "num_replicas": 3}).autoscaling() is None


@pytest.mark.parametrize(("args", "message"), [
    ({"repository": "/m", "min_replicas": 3, "max_replicas": 1}, "min_replicas must be <="),
    ({"repository": "/m", "memory_budget": "lots"}, "field 'memory_budget'"),
    ({"repository": "/m", "replicas": 2}, "field 'replicas': Extra inputs"),
    ({}, "field 'repository': Field required"),
])
def test_bad_arguments_name_the_field(args: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ClusterConfig.parse(args)


def test_replicas_serve_lazily_under_the_budget() -> None:
    config = ClusterConfig.parse({"repository": "file:///srv/models", "memory_budget": "1GiB"})
    assert not config.is_remote()
    server = config.server_config(Path("/srv/models"))
    assert server.model_control == "lazy" and int(server.memory_budget or 0) == 2**30
    assert ClusterConfig.parse({"repository": "s3://bucket/models"}).is_remote()


def test_a_replica_takes_serves_settings_and_their_defaults() -> None:
    default = ClusterConfig.parse({"repository": "/m"}).server_config(Path("/m"))
    standalone = ServerConfig(repository=Path("/m"))
    for name in ("max_inflight", "default_timeout_ms", "max_concurrent_loads", "metrics_top_k",
                 "max_tensor_elements", "auth_tokens", "limits", "allow_python_models"):
        assert getattr(default, name) == getattr(standalone, name), name
    chosen = ClusterConfig.parse({
        "repository": "/m", "auth_tokens": "/secrets/tokens.yaml", "metrics_top_k": 3,
        "limits": {"max_request_bytes": 1024}, "max_tensor_elements": 10,
    }).server_config(Path("/m"))
    assert chosen.auth_tokens == Path("/secrets/tokens.yaml") and chosen.metrics_top_k == 3
    assert chosen.limits == TransportLimits(max_request_bytes=1024)
    assert chosen.max_tensor_elements == 10
