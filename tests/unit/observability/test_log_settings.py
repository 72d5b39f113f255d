"""The logging extension's settings: checked updates, and what they let through to a handler."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from serval.errors import InvalidInput
from serval.observability.log_settings import LogControl, LogSettings
from serval.observability.logging import JsonLineFormatter

pytestmark = pytest.mark.unit


def test_log_level_flag_in_the_extensions_terms() -> None:
    assert LogSettings.from_level("info") == LogSettings()
    assert LogSettings.from_level("debug").log_verbose_level == 1
    warning = LogSettings.from_level("warning")
    assert (warning.log_info, warning.log_warnings, warning.log_errors) == (False, True, True)
    assert not LogSettings.from_level("error").log_warnings
    assert LogSettings().as_dict() == {"log_file": "", "log_info": True, "log_warnings": True,
                                       "log_errors": True, "log_verbose_level": 0,
                                       "log_format": "default"}


@pytest.mark.parametrize(("changes", "named"), [
    ({"log_info": 1}, "'log_info' must be a boolean, got 1"),
    ({"log_errors": "false"}, "'log_errors' must be a boolean"),
    ({"log_verbose_level": -1}, "from 0 to 4294967295, got -1"),
    ({"log_verbose_level": True}, "'log_verbose_level' must be an integer"),
    ({"log_verbose_level": 2**32}, "'log_verbose_level' must be an integer"),
    ({"log_format": "xml"}, "one of default, ISO8601, got 'xml'"),
    ({"log_file": "/tmp/elsewhere"}, "'log_file' cannot be changed"),
    ({"log_warning": True}, "unknown log setting 'log_warning'"),
])
def test_a_bad_setting_is_named_and_nothing_changes(changes: dict[str, object],
                                                    named: str) -> None:
    before = LogSettings()
    with pytest.raises(InvalidInput, match=named.replace("(", r"\(")):
        before.updated({"log_verbose_level": 3, **changes})
    assert before == LogSettings()


def test_an_update_changes_only_what_it_names() -> None:
    after = LogSettings().updated({"log_info": False, "log_verbose_level": 2, "log_file": ""})
    assert after == LogSettings(log_info=False, log_verbose_level=2)


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.setFormatter(JsonLineFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(self.format(record))


@pytest.fixture
def root_handler() -> Iterator[_Collect]:
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    handler = _Collect()
    root.handlers[:] = [handler]
    yield handler
    root.handlers[:] = saved_handlers
    root.setLevel(saved_level)


def _emit_each_level() -> None:
    log = logging.getLogger("serval.test")
    log.debug("debug")
    log.info("info")
    log.warning("warning")
    log.error("error")


def test_the_settings_decide_which_records_reach_the_handler(root_handler: _Collect) -> None:
    control = LogControl(LogSettings())
    _emit_each_level()
    assert ['"msg":"debug"' in line for line in root_handler.seen] == [False, False, False]
    root_handler.seen.clear()
    control.update({"log_verbose_level": 1, "log_warnings": False})
    _emit_each_level()
    assert [line.split('"msg":"')[1].split('"')[0] for line in root_handler.seen] == [
        "debug", "info", "error"]
    root_handler.seen.clear()
    control.update({"log_verbose_level": 0, "log_info": False, "log_errors": False,
                    "log_warnings": True})
    _emit_each_level()
    assert [line.split('"msg":"')[1].split('"')[0] for line in root_handler.seen] == ["warning"]


def test_iso8601_format_drops_the_milliseconds(root_handler: _Collect) -> None:
    control = LogControl(LogSettings())
    logging.getLogger("serval.test").warning("one")
    control.update({"log_format": "ISO8601"})
    logging.getLogger("serval.test").warning("two")
    default, iso = (line.split('"ts":"')[1].split('"')[0] for line in root_handler.seen)
    assert len(default) == len("2026-01-01T00:00:00.000Z")
    assert len(iso) == len("2026-01-01T00:00:00Z") and iso.endswith("Z")
