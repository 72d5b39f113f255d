"""Reading a repository: version folders are ASCII digits only, a model folder needs a UTF-8
name, and a config that is a folder is that model's ConfigError."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from serval.errors import ConfigError
from serval.repository.layout import scan_model, scan_repository
from serval.repository.store import is_version_name, latest_version

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("name", "is_version"), [
    ("1", True), ("0012", True), ("²", False), ("٣", False), ("\uff11", False), ("-1", False),
    ("1_0", False), ("", False)])
def test_version_names_are_ascii_digits(name: str, is_version: bool) -> None:
    assert is_version_name(name) is is_version


def test_unicode_digit_folders_are_not_versions(tmp_path: Path) -> None:
    for folder in ("1", "²", "٣", "10"):
        (tmp_path / "m" / folder).mkdir(parents=True)
    assert scan_model(tmp_path, "m").versions == ("1", "10")  # type: ignore[union-attr]
    assert latest_version(tmp_path, "m") == "10"
    (tmp_path / "n" / "²").mkdir(parents=True)  # no version: reported, never an int() crash
    with pytest.raises(ConfigError, match="no version directory"):
        scan_model(tmp_path, "n").latest_spec()  # type: ignore[union-attr]


def test_a_folder_named_in_other_bytes_than_utf8_is_skipped_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "good" / "1").mkdir(parents=True)
    os.mkdir(os.fsencode(tmp_path) + b"/bad\xfe")
    with caplog.at_level(logging.WARNING, "serval.repository.layout"):
        assert [d.name for d in scan_repository(tmp_path)] == ["good"]
        assert [d.name for d in scan_repository(tmp_path)] == ["good"]
    warnings = [r for r in caplog.records if "not valid UTF-8" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].folder == "bad\\xfe"  # type: ignore[attr-defined]


@pytest.mark.parametrize("file", ["config.yaml", "config.pbtxt"])
def test_a_config_file_that_is_a_folder_is_a_config_error(tmp_path: Path, file: str) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / file).mkdir()
    with pytest.raises(ConfigError, match=f"{file}: is a folder; it must be a file"):
        scan_model(tmp_path, "m").config()  # type: ignore[union-attr]
