"""RepositoryMirror: a remote (fsspec) repository copied once per version, following serving
changes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from serval.cluster.mirror import RepositoryMirror
from serval.errors import ConfigError

pytestmark = pytest.mark.unit


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
