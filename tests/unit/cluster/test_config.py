"""ClusterConfig validation, the ingress's path helpers, and the fsspec repository mirror."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from serval.cluster.config import ClusterConfig
from serval.cluster.mirror import RepositoryMirror
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


def test_model_of_and_retry_safety() -> None:
    from serval.cluster.ray import model_of, retry_safe

    assert model_of("/v2/models/lin0/infer") == "lin0"
    assert model_of("/v2/models/lin0/versions/2/infer") == "lin0"
    assert model_of("/v2/repository/models/clf/load") == "clf"
    assert model_of("/v2/models/stats") == "" and model_of("/v2/health/ready") == ""
    assert retry_safe("/v2/models/lin0/infer") and retry_safe("/v2/health/ready")
    assert not retry_safe("/v2/repository/models/clf/unload")


def _write(fs: object, path: str, data: bytes) -> None:
    with fs.open(path, "wb") as handle:  # type: ignore[attr-defined]
        handle.write(data)


def test_mirror_copies_versions_once_and_follows_serving_changes(tmp_path: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = f"/serval-test-{os.getpid()}-{time.monotonic_ns()}"
    _write(fs, f"{root}/clf/1/model.onnx", b"v1")
    _write(fs, f"{root}/clf/config.yaml", b"max_batch_size: 8\n")
    _write(fs, f"{root}/clf/serving.json", b'{"version": "1"}')
    mirror = RepositoryMirror(f"memory://{root}", tmp_path / "mirror")
    assert mirror.sync() == 3
    local = tmp_path / "mirror" / "clf"
    assert (local / "1" / "model.onnx").read_bytes() == b"v1"
    assert mirror.sync() == 0  # nothing changed: nothing copied, mtimes untouched
    _write(fs, f"{root}/clf/2/model.onnx", b"v2")
    _write(fs, f"{root}/clf/serving.json", b'{"version": "2"}')
    assert mirror.sync() == 2
    assert (local / "2" / "model.onnx").read_bytes() == b"v2"
    assert (local / "serving.json").read_bytes() == b'{"version": "2"}'
    assert not [p for p in local.iterdir() if p.name.startswith(".")]  # no staging left over


def test_an_unknown_protocol_is_a_config_error(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    with pytest.raises(ConfigError, match="nosuchproto://x"):
        RepositoryMirror("nosuchproto://x", tmp_path)
