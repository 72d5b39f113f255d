"""One-line JSON logs (time, level, logger, message, extras) and internal-error reports."""

from __future__ import annotations

import logging
import sys
import time
import uuid
from typing import Any

import orjson

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class JsonLineFormatter(logging.Formatter):
    """Formats a record as one JSON object per line; extras become fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
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


def configure_logging(level: str = "info") -> None:
    """Send every log record to stderr as JSON lines at the given level."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def report_internal_error(exc: BaseException, where: str, summary: str, detail: str) -> str:
    """Log an engine or server failure with a new request id; return the client's message.

    The client sees only the summary and the id; the detail and traceback stay in the log.
    """
    request_id = uuid.uuid4().hex[:16]
    cause = exc.__cause__ or exc
    logging.getLogger("serval.errors").error(
        detail,
        extra={"request_id": request_id, "where": where},
        exc_info=(type(cause), cause, cause.__traceback__),
    )
    return f"{summary} (request id {request_id}; details are in the server log)"
