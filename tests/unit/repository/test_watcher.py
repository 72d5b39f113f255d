"""What makes the watcher reload a model: its folder's signature."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serval.repository.watcher import model_signature

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("config", ["config.yaml", "config.pbtxt", "serving.json"])
def test_an_edited_config_changes_the_signature(tmp_path: Path, config: str) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / config).write_text("")
    os.utime(tmp_path / config, (1_000, 1_000))
    before = model_signature(tmp_path)
    os.utime(tmp_path / config, (2_000, 2_000))
    assert model_signature(tmp_path) != before


def test_a_new_version_folder_changes_the_signature(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    before = model_signature(tmp_path)
    (tmp_path / "2").mkdir()
    assert model_signature(tmp_path) != before
