"""The HTTP app's header readers: timeouts, lengths and content encodings refused with a
precise 400; load's file parameters decoded from base64."""

from __future__ import annotations

import pytest

from serval.errors import InvalidInput
from serval.server.http.app import _file_parameters, _repository_parameters
from serval.server.http.infer_headers import decompress as _decompress
from serval.server.http.infer_headers import parse_header_length as _header_length
from serval.server.http.infer_headers import parse_timeout_ms as _timeout_ms

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value", [b"inf", b"nan", b"1e308", b"-1", b"0", b"\xff", b"86400001"])
def test_timeouts_must_be_finite_positive_and_at_most_a_day(value: bytes) -> None:
    with pytest.raises(InvalidInput, match="at most 86400000"):
        _timeout_ms(value)


def test_a_timeout_within_bounds_is_taken() -> None:
    assert _timeout_ms(b"86400000") == 86_400_000.0
    assert _timeout_ms(b" 2.5 ") == 2.5


@pytest.mark.parametrize("value", [b"\xff\xfe", b"-1", b"1_0", b"+5", b"9" * 20, b""])
def test_header_lengths_are_plain_ascii_integers(value: bytes) -> None:
    with pytest.raises(InvalidInput, match="must be a non-negative integer"):
        _header_length(value)
    assert _header_length(b" 12 ") == 12


def test_a_non_utf8_content_encoding_is_shown_escaped() -> None:
    with pytest.raises(InvalidInput) as caught:
        _decompress(b"x", b"\xff\xfe", 100)
    assert caught.value.message.startswith("Content-Encoding '\\xff\\xfe' is not supported")


def test_file_parameters_are_base64_and_other_parameters_are_left_alone() -> None:
    params = {"config": "{}", "file:1/model.onnx": "b25ueA==", "ready": True}
    assert _file_parameters("m", params) == {"file:1/model.onnx": b"onnx"}
    for value in ("not base64!", 5, "é"):
        with pytest.raises(InvalidInput, match="failed to load 'm': parameter 'file:1/a' must "
                                               "be the file's bytes as base64"):
            _file_parameters("m", {"file:1/a": value})


@pytest.mark.parametrize("value", [b"1_000", b"\xef\xbc\x91\xef\xbc\x92", b"0x10", b"1e", b"."])
def test_timeouts_are_plain_ascii_decimals(value: bytes) -> None:
    with pytest.raises(InvalidInput, match="must be a positive number of milliseconds"):
        _timeout_ms(value)
    assert _timeout_ms(b"1e3") == 1000.0 and _timeout_ms(b".5") == 0.5


@pytest.mark.parametrize(("body", "message"), [
    (b'{"parameters": []}', "'parameters' must be a JSON object, got []"),
    (b'{"parameters": "x"}', "'parameters' must be a JSON object, got 'x'"),
    (b'{"parameters": 0}', "'parameters' must be a JSON object, got 0"),
])
def test_repository_parameters_must_be_an_object(body: bytes, message: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        _repository_parameters(body)
    assert caught.value.message == message
    assert _repository_parameters(b'{"parameters": null, "ready": true}') == {
        "parameters": None, "ready": True}
