"""One-line JSON logs (time, level, logger, message, extras) and internal-error reports."""

from __future__ import annotations

import logging
import sys
import time
import uuid
from typing import Any

import orjson

from serval.observability.log_settings import LogControl, LogSettings

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonLineFormatter(logging.Formatter):
    """Formats a record as one JSON object per line; extras become fields. `whole_seconds`:
    the time without its milliseconds (the logging extension's ISO8601 format)."""

    whole_seconds = False

    def format(self, record: logging.LogRecord) -> str:
        fraction = "" if self.whole_seconds else f".{int(record.msecs):03d}"
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + fraction + "Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


_control: LogControl | None = None


def configure_logging(level: str = "info") -> LogControl:
    """Send every log record to stderr as JSON lines at the given level; the settings that
    the logging extension changes from then on."""
    global _control
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    _control = LogControl(LogSettings.from_level(level))
    return _control


def log_control() -> LogControl | None:
    """This process's log settings, if configure_logging set up its logging (None: a host
    process such as a test runner owns it, and the logging extension is off)."""
    return _control


def report_internal_error(exc: BaseException, where: str, summary: str, detail: str) -> str:
    """Log an engine or server failure with a new request id; return the client's message.

    The client sees only the summary and the id; the detail and traceback stay in the log
    (an error whose `log_traceback` is false, a model's own failure: one line, the traceback
    only at debug level).
    """
    request_id = uuid.uuid4().hex[:16]
    cause = exc.__cause__ or exc
    exc_info = (type(cause), cause, cause.__traceback__)
    logger = logging.getLogger("serval.errors")
    extra = {"request_id": request_id, "where": where}
    if getattr(exc, "log_traceback", True):
        logger.error(detail, extra=extra, exc_info=exc_info)
    else:
        logger.error(detail, extra=extra)
        logger.debug("the model's traceback", extra=extra, exc_info=exc_info)
    return f"{summary} (request id {request_id}; details are in the server log)"
