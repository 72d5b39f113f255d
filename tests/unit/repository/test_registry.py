"""ModelRegistry: requested names, public reasons."""

from __future__ import annotations

from pathlib import Path

import pytest

from serval.errors import InvalidInput
from serval.repository.registry import ModelRegistry, check_requested_name

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("name", "expected"), [
    ("m" * 256, "256 bytes is too long"), ("é" * 128, "256 bytes is too long"),
    ("a/b", "may not contain"), ("a\\b", "may not contain"), ("a\x00b", "may not contain"),
    ("\udcff", "valid Unicode"),
])
def test_names_no_folder_can_have_are_refused(name: str, expected: str) -> None:
    with pytest.raises(InvalidInput, match=expected):
        check_requested_name(name)
    check_requested_name("m" * 255)


def test_reasons_lose_the_repository_path(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path, {})
    reason = registry.public_reason(
        f"Load model from {tmp_path}/m/1/model.onnx failed; see /usr/lib/x/libfoo.so")
    assert reason == "Load model from m/1/model.onnx failed; see libfoo.so"
