"""Durations on the command line: `500ms`, `3s`, `2m`, `1h`, or a bare number in the flag's own
unit (seconds, or milliseconds for a `-ms` flag). The one parser every duration flag uses."""

from __future__ import annotations

import re

import typer

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$")
_UNIT_MS = {"ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}
EXAMPLES = "e.g. 500ms, 3s, 2m, 1h"


def parse_duration(text: str | float, unit: str = "s") -> float:
    """TEXT in UNIT ('ms' or 's'): '500ms' -> 0.5 s, '2m' -> 120 s, a bare '3' is 3 UNIT.

    A number (a flag's default) is already in UNIT; anything else raises ValueError."""
    if isinstance(text, (int, float)):
        return float(text)
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration ({EXAMPLES}, or a number)")
    value, suffix = float(match[1]), match[2] or unit
    return value if suffix == unit else value * _UNIT_MS[suffix] / _UNIT_MS[unit]


def seconds(text: str | float) -> float:
    """A duration flag in seconds: a bare number is seconds."""
    return _flag(text, "s")


def milliseconds(text: str | float) -> float:
    """A duration flag in milliseconds (`--slo-p99-ms`): a bare number is milliseconds."""
    return _flag(text, "ms")


def _flag(text: str | float, unit: str) -> float:
    try:
        return parse_duration(text, unit)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
