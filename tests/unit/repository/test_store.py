"""Snapshots on disk: atomic publish with manifests, history, rollback, verification."""

from __future__ import annotations

from pathlib import Path

import pytest

from serval.errors import ConfigError
from serval.repository import store

pytestmark = pytest.mark.unit


def _artifact(tmp_path: Path, content: bytes, name: str = "model.onnx") -> Path:
    source = tmp_path / "src" / content.hex()[:8]
    source.mkdir(parents=True)
    (source / name).write_bytes(content)
    return source / name


def test_publish_numbers_versions_and_writes_a_manifest(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    assert store.publish(_artifact(tmp_path, b"one"), repository, "m", note="run 1") == "1"
    assert store.publish(_artifact(tmp_path, b"two"), repository, "m") == "2"
    manifest = store.read_manifest(repository / "m" / "2")
    assert manifest is not None and set(manifest["files"]) == {"model.onnx"}
    assert (repository / "m" / "2" / "model.onnx").read_bytes() == b"two"
    assert not [p for p in (repository / "m").iterdir() if p.name.startswith(".")]
    records = store.history(repository, "m")
    assert (records[0].version, records[0].serving, records[0].source) == ("1", False, "run 1")
    assert records[-1].serving


def test_rollback_pins_the_previous_or_a_given_version(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    for content in (b"a", b"b", b"c"):
        store.publish(_artifact(tmp_path, content), repository, "m")
    assert store.rollback(repository, "m") == "2"
    assert store.serving_version(repository / "m") == "2"
    assert store.rollback(repository, "m") == "1"
    with pytest.raises(ConfigError, match="no version older than 1"):
        store.rollback(repository, "m")
    assert store.rollback(repository, "m", to="3") == "3"
    with pytest.raises(ConfigError, match="has no version 7"):
        store.rollback(repository, "m", to="7")


def test_verify_finds_corruption_and_rollback_refuses_it(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    store.publish(_artifact(tmp_path, b"good"), repository, "m")
    store.publish(_artifact(tmp_path, b"newer"), repository, "m")
    assert store.verify_version(repository / "m" / "1") == []
    (repository / "m" / "1" / "model.onnx").write_bytes(b"tampered")
    assert store.verify_version(repository / "m" / "1") == ["model.onnx: checksum mismatch"]
    with pytest.raises(ConfigError, match="version 1 is corrupted"):
        store.rollback(repository, "m")


def test_publishing_nothing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nothing to publish"):
        store.publish(tmp_path / "missing.onnx", tmp_path / "repo", "m")


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "", "x" * 200])
def test_model_names_cannot_leave_the_repository(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="is not allowed"):
        store.publish(_artifact(tmp_path, b"x"), tmp_path / "repo", name)
    assert not (tmp_path / "escape").exists()
