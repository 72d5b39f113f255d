"""Repository snapshots: what serves, recorded by name and restored in one go (or not at all)."""

from __future__ import annotations

from pathlib import Path

import pytest

from serval.errors import ConfigError
from serval.repository import snapshots, store

pytestmark = pytest.mark.unit


def _publish(tmp_path: Path, repository: Path, model: str, content: str) -> str:
    source = tmp_path / f"{model}-{content}.onnx"
    source.write_text(content)
    return store.publish(source, repository, model)


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for model, contents in (("a", ("a1", "a2")), ("b", ("b1",))):
        for content in contents:
            _publish(tmp_path, root, model, content)
    return root


def test_a_snapshot_records_what_serves_and_restore_brings_it_back(
        tmp_path: Path, repository: Path) -> None:
    store.rollback(repository, "a")  # a serves 1 (pinned), b its latest, 1
    taken = snapshots.take(repository, "before-fine-tune")
    assert taken.models == {"a": "1", "b": "1"}
    store.unpin(repository, "a")
    _publish(tmp_path, repository, "b", "b2")
    assert [r.version for r in store.history(repository, "a") if r.serving] == ["2"]
    restored = snapshots.restore(repository, "before-fine-tune")
    assert restored.models == {"a": "1", "b": "1"}
    for model in ("a", "b"):
        assert [r.version for r in store.history(repository, model) if r.serving] == ["1"]
    assert [s.name for s in snapshots.listing(repository)] == ["before-fine-tune"]


def test_a_snapshot_is_not_a_model_and_names_are_checked(repository: Path) -> None:
    snapshots.take(repository, "s1")
    assert not (repository / "s1").exists() and (repository / ".snapshots" / "s1.json").is_file()
    with pytest.raises(ConfigError, match="exists"):
        snapshots.take(repository, "s1")
    for bad in ("../escape", ".hidden", "a/b"):
        with pytest.raises(ConfigError, match="not allowed"):
            snapshots.take(repository, bad)
    with pytest.raises(ConfigError, match="no snapshot 'nope'"):
        snapshots.restore(repository, "nope")


def test_restore_pins_nothing_when_a_version_is_gone_or_corrupted(repository: Path) -> None:
    snapshots.take(repository, "s")
    (repository / "b" / "1" / "b-b1.onnx").write_text("tampered")
    with pytest.raises(ConfigError, match=r"'b' version 1 is corrupted.*nothing was restored"):
        snapshots.restore(repository, "s")
    assert store.serving_version(repository / "a") is None  # a was not pinned either


def test_an_empty_repository_has_nothing_to_snapshot(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no published model"):
        snapshots.take(tmp_path / "empty")
    with pytest.raises(ConfigError, match="not found"):
        snapshots.take(tmp_path / "missing")
