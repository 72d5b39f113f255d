"""The model table: a model whose version policy selects no folder on disk is listed as
UNAVAILABLE with the reason, and a request reaching it gets that reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from serval.errors import InvalidInput
from serval.repository.layout import scan_repository
from serval.repository.served import ModelState
from serval.repository.table import ModelTable

pytestmark = pytest.mark.unit


def _table(tmp_path: Path, config: str) -> ModelTable:
    (tmp_path / "pol" / "1").mkdir(parents=True)
    (tmp_path / "pol" / "config.yaml").write_text(config)
    table = ModelTable(tmp_path, "all")
    for directory in scan_repository(tmp_path):
        table._track(directory)
    return table


def test_a_policy_selecting_no_folder_is_reported_not_dropped(tmp_path: Path) -> None:
    table = _table(tmp_path, "version_policy: {specific: [7]}\n")
    [entry] = table.index()
    assert entry["name"] == "pol" and entry["state"] == ModelState.UNAVAILABLE.value
    assert entry["reason"] == ("the version policy selects no version folder (version_policy "
                               "{'specific': [7]}; version folders: 1)")
    assert table.get("pol").reason == entry["reason"]  # what an unversioned request reaches
    [problem] = table.not_serving(["pol"])
    assert "the version policy selects no version folder" in problem


def test_a_requested_version_in_unicode_digits_is_invalid_not_a_crash(tmp_path: Path) -> None:
    table = _table(tmp_path, "")
    for version in ("²", "٣"):
        with pytest.raises(InvalidInput, match="version should be an integral value"):
            table.get("pol", version)
