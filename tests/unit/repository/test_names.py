"""What clients are told about model names: names no model folder can have are refused with
why, failure reasons lose the filesystem's paths, and Triton's words for an unready model."""

from __future__ import annotations

from pathlib import Path

import pytest

from serval.errors import InvalidInput
from serval.repository.names import check_requested_name, not_ready_message, public_reason
from serval.repository.served import ModelState, ServedModel

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
    reason = public_reason(
        tmp_path, f"Load model from {tmp_path}/m/1/model.onnx failed; see /usr/lib/x/libfoo.so")
    assert reason == "Load model from m/1/model.onnx failed; see libfoo.so"


def test_an_unready_version_is_named_in_tritons_words_with_the_reason() -> None:
    served = ServedModel("m", "3", ModelState.EVICTED, "evicted to fit the memory budget")
    assert not_ready_message(served) == (
        "Request for unknown model: 'm' version 3 is not at ready state (evicted to fit the "
        "memory budget)")
    assert not_ready_message(served, versioned=False) == (
        "Request for unknown model: 'm' has no available versions: version 3 is EVICTED "
        "(evicted to fit the memory budget)")
