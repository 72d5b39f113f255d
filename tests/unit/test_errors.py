"""How error messages quote a client's value: repr-like, bounded in length and in nesting, so a
hostile value (1024-deep JSON, 8M elements) costs little and never raises."""

from __future__ import annotations

import time

import orjson
import pytest

from serval.errors import shown

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value", [
    1, -2.5, True, None, "abc", b"x", [1, "a", None], {"a": [1, 2]}, (1,), (), [], {},
    [[1, 2], [3, 4]], "it's \"quoted\"",
])
def test_a_short_value_reads_as_its_repr(value: object) -> None:
    assert shown(value, 80) == repr(value)


def test_a_long_value_is_cut_to_the_limit() -> None:
    assert shown("x" * 100) == "'" + "x" * 36 + "..."
    assert len(shown(list(range(1000)), 50)) == 50
    assert shown(list(range(1000)), 20) == "[0, 1, 2, 3, 4, 5..."


def test_json_nested_as_deep_as_a_parser_allows_is_shown_briefly() -> None:
    deep = orjson.loads("[" * 1024 + "1" + "]" * 1024)  # repr() of it raises RecursionError
    text = shown(deep, 200)
    assert text.startswith("[[[[") and "...]" in text and len(text) <= 200
    assert shown({"a": deep}).startswith("{'a': [[[")


def test_a_huge_value_costs_what_the_limit_allows() -> None:
    huge = [[0.5] * 1000 for _ in range(4000)]  # 4M elements: repr() takes seconds
    started = time.perf_counter()
    for _ in range(100):
        shown(huge, 200)
    assert time.perf_counter() - started < 0.5


def test_an_int_too_long_for_repr_is_named_by_its_type() -> None:
    assert shown(10**5000) == "<int>"


def test_a_message_quoting_a_huge_value_keeps_its_start_and_end_only() -> None:
    """A config field of 10 KB was echoed whole in the reply (and in gRPC's grpc-message
    trailer, which grpcio clients refuse past 8 KiB)."""
    from serval.errors import MAX_MESSAGE_CHARS, InvalidInput, LoadFailed

    error = LoadFailed(f"field 'platform' '{'x' * 10_000}' is not supported (it serves onnx)")
    assert len(error.message) <= MAX_MESSAGE_CHARS and str(error) == error.message
    assert error.message.startswith("field 'platform' 'xxx")
    assert error.message.endswith("is not supported (it serves onnx)")
    assert " ... " in error.message
    short = "shape [1, 7] given, model expects [-1, 8]"
    assert InvalidInput(short).message == short  # what fits is never touched
