"""Triton's logging extension: which records the server writes, changed while it runs.

`GET /v2/logging` (gRPC `LogSettings` with no settings) reads the settings; a POST with some
of them changes those and answers all six. They map onto Python's logging: `log_info`,
`log_warnings` and `log_errors` let INFO, WARNING and ERROR (and CRITICAL) records through,
`log_verbose_level` > 0 lets DEBUG records through, `log_format` picks the `ts` field's form
(`default`: milliseconds, `ISO8601`: whole seconds, as Triton writes it). Serval logs JSON lines
to stderr: `log_file` reads "" and a client cannot point it elsewhere (a network client must not
choose where the server writes files), as Triton refuses it too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from serval.errors import InvalidInput, shown

FORMATS = ("default", "ISO8601")
MAX_VERBOSE = 2**32 - 1  # a uint32, as Triton's gRPC message carries it
_FLAGS = ("log_info", "log_warnings", "log_errors")


@dataclass(frozen=True)
class LogSettings:
    log_info: bool = True
    log_warnings: bool = True
    log_errors: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"

    @classmethod
    def from_level(cls, level: str) -> LogSettings:
        """What `--log-level` means in these terms."""
        level = level.lower()
        return cls(log_info=level in ("debug", "info"), log_warnings=level != "error",
                   log_verbose_level=1 if level == "debug" else 0)

    def as_dict(self) -> dict[str, bool | int | str]:
        return {"log_file": "", **asdict(self)}

    def updated(self, changes: Mapping[str, object]) -> LogSettings:
        """These settings with `changes` applied; InvalidInput names the first bad one and
        nothing changes."""
        fields: dict[str, object] = {}
        for name, value in changes.items():
            if name == "log_file":
                if value != "":
                    raise InvalidInput("log setting 'log_file' cannot be changed over the API: "
                                       "Serval logs JSON lines to stderr; redirect that instead")
            elif name in _FLAGS:
                if type(value) is not bool:
                    raise InvalidInput(f"log setting '{name}' must be a boolean, got "
                                       f"{shown(value)}")
                fields[name] = value
            elif name == "log_verbose_level":
                if type(value) is not int or not 0 <= value <= MAX_VERBOSE:
                    raise InvalidInput("log setting 'log_verbose_level' must be an integer from "
                                       f"0 to {MAX_VERBOSE}, got {shown(value)}")
                fields[name] = value
            elif name == "log_format":
                if value not in FORMATS:
                    raise InvalidInput("log setting 'log_format' must be one of "
                                       f"{', '.join(FORMATS)}, got {shown(value)}")
                fields[name] = value
            else:
                raise InvalidInput(f"unknown log setting '{name[:64]}'; the settings are "
                                   f"log_file, {', '.join(_FLAGS)}, log_verbose_level, "
                                   "log_format")
        return replace(self, **fields)  # type: ignore[arg-type]


class LogControl:
    """The process's log settings, applied to the root logger's handlers as they change."""

    def __init__(self, settings: LogSettings) -> None:
        self.settings = settings
        self._filter = _SettingsFilter(settings)
        self._apply()

    def get(self) -> dict[str, bool | int | str]:
        return self.settings.as_dict()

    def update(self, changes: Mapping[str, object]) -> dict[str, bool | int | str]:
        self.settings = self.settings.updated(changes)
        self._apply()
        return self.get()

    def _apply(self) -> None:
        settings = self.settings
        self._filter.settings = settings
        root = logging.getLogger()
        for handler in root.handlers:
            if self._filter not in handler.filters:
                handler.addFilter(self._filter)
            seconds = getattr(handler.formatter, "whole_seconds", None)
            if seconds is not None:
                handler.formatter.whole_seconds = settings.log_format == "ISO8601"  # type: ignore[union-attr]
        # the cheapest level that lets every wanted record reach the filter
        if settings.log_verbose_level:
            root.setLevel(logging.DEBUG)
        elif settings.log_info:
            root.setLevel(logging.INFO)
        elif settings.log_warnings:
            root.setLevel(logging.WARNING)
        else:
            root.setLevel(logging.ERROR)


class _SettingsFilter(logging.Filter):
    def __init__(self, settings: LogSettings) -> None:
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        settings, level = self.settings, record.levelno
        if level >= logging.ERROR:
            return settings.log_errors
        if level >= logging.WARNING:
            return settings.log_warnings
        if level >= logging.INFO:
            return settings.log_info
        return settings.log_verbose_level > 0

