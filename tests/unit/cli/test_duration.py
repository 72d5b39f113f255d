"""The one duration parser of the command line: units, bare numbers in the flag's unit, refusals."""

from __future__ import annotations

import pytest
import typer

from serval.cli.duration import milliseconds, parse_duration, seconds

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("text", "expected_s"), [
    ("3s", 3.0), ("2m", 120.0), ("500ms", 0.5), ("1h", 3600.0), ("90", 90.0), ("0.25", 0.25),
    (" 1.5 s ", 1.5), (".5m", 30.0), ("0", 0.0), (10.0, 10.0),
])
def test_seconds_accept_units_and_bare_seconds(text: str | float, expected_s: float) -> None:
    assert seconds(text) == pytest.approx(expected_s)


@pytest.mark.parametrize(("text", "expected_ms"), [
    ("200", 200.0), ("2s", 2000.0), ("250ms", 250.0), ("1m", 60_000.0), (5.0, 5.0),
])
def test_a_millisecond_flag_reads_a_bare_number_as_milliseconds(text: str | float,
                                                                expected_ms: float) -> None:
    assert milliseconds(text) == pytest.approx(expected_ms)


def test_a_bare_number_or_its_own_unit_comes_back_exactly() -> None:
    assert parse_duration("0.1", "s") == 0.1 and parse_duration("0.1s", "s") == 0.1
    assert parse_duration("2.5ms", "ms") == 2.5


@pytest.mark.parametrize("text", ["3x", "", "s", "-1s", "1e3", "2 m s", "1sm", "ms5", "nan"])
def test_anything_else_is_refused_with_the_text_and_examples(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration") as refused:
        parse_duration(text)
    assert repr(text) in str(refused.value) and "500ms" in str(refused.value)
    with pytest.raises(typer.BadParameter, match="is not a duration"):
        seconds(text)
