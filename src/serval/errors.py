"""Serval's error vocabulary: one code per failure kind, no transport imports."""

from __future__ import annotations

import enum


class ErrorCode(enum.Enum):
    """What went wrong, independent of the transport that reports it."""

    INVALID_INPUT = "invalid_input"
    MODEL_NOT_FOUND = "model_not_found"
    MODEL_NOT_READY = "model_not_ready"
    OVERLOADED = "overloaded"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    BACKEND_ERROR = "backend_error"
    UNAVAILABLE = "unavailable"
    UNAUTHENTICATED = "unauthenticated"
    PERMISSION_DENIED = "permission_denied"


# A message longer than this keeps its start and its end: one quoting a client's value whole
# (a 10 KB config field) made a reply, and a gRPC grpc-message trailer, of any size (grpcio
# clients refuse trailers past 8 KiB, and then see another error than the one sent).
MAX_MESSAGE_CHARS = 2000


class ServalError(Exception):
    """Base of every error Serval reports to a client."""

    code: ErrorCode = ErrorCode.BACKEND_ERROR
    retry_after_s: float | None = None  # when to ask again (HTTP Retry-After, gRPC pushback)

    def __init__(self, message: str) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            head = MAX_MESSAGE_CHARS * 2 // 3
            tail = MAX_MESSAGE_CHARS - head - 5
            message = f"{message[:head]} ... {message[-tail:]}"
        super().__init__(message)
        self.message = message


class InvalidInput(ServalError):
    """The request is malformed or does not match the model (HTTP 400)."""

    code = ErrorCode.INVALID_INPUT


class EngineRejectedInput(InvalidInput):
    """The engine refused the input values (e.g. a token id outside the vocabulary): HTTP 400.

    `detail` is the engine's own account of the problem, free of node and file names.
    """

    def __init__(self, message: str, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


class UnsupportedCall(InvalidInput):
    """The call cannot serve this model (a decoupled model over a unary call): HTTP 400,
    gRPC UNIMPLEMENTED (Triton's status for it)."""


class DecoupledUnary(UnsupportedCall):
    """A decoupled model asked through a unary call (it answers 0..n times per request)."""


class ModelNotFound(ServalError):
    """No such model or version in the repository (HTTP 404)."""

    code = ErrorCode.MODEL_NOT_FOUND


class ModelNotReady(ServalError):
    """The model exists but cannot serve now (HTTP 503)."""

    code = ErrorCode.MODEL_NOT_READY


class WorkerHeld(ModelNotReady):
    """A model's worker process crashed again and again; its restart waits (HTTP 503 with
    Retry-After)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class LoadFailed(InvalidInput):
    """A model cannot load from what the repository holds (a broken file or config, no
    version to load): HTTP 400, gRPC INVALID_ARGUMENT, as Triton's load. Retrying does not
    help, unlike ModelNotReady (no room now)."""


class Overloaded(ServalError):
    """The server refuses work it could not finish in time (HTTP 429)."""

    code = ErrorCode.OVERLOADED
    retry_after_s: float

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(ServalError):
    """The request's deadline passed before it could be computed (HTTP 504)."""

    code = ErrorCode.DEADLINE_EXCEEDED


class BackendError(ServalError):
    """The engine failed; the client sees generic text, the log the cause (HTTP 500)."""

    code = ErrorCode.BACKEND_ERROR
    public_message = "the model failed to run the request"
    log_traceback = True  # the cause's traceback goes to the log at error level


class ModelFailed(BackendError):
    """Model code (a Python model) failed: the client sees the model's own error, its type
    and message cut short (backends/model_code.py; Triton returns it), and the log one line
    (the traceback only at debug level: `log_traceback`)."""

    log_traceback = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.public_message = message


class ServerUnavailable(ServalError):
    """The server is shutting down or not started (HTTP 503)."""

    code = ErrorCode.UNAVAILABLE


class Unauthenticated(ServalError):
    """No valid credentials (HTTP 401)."""

    code = ErrorCode.UNAUTHENTICATED


class PermissionDenied(ServalError):
    """Valid credentials without the needed scope (HTTP 403)."""

    code = ErrorCode.PERMISSION_DENIED


class ConfigError(Exception):
    """A repository or config file is invalid; the message names the file and field."""


_SHOWN_DEPTH = 8  # nesting shown before "[...]": a client's JSON may nest 1024 deep


def shown(value: object, limit: int = 40) -> str:
    """A client's value as an error message quotes it: repr, cut to about `limit` characters.

    Built piece by piece within the limit and at most a few levels deep, so a value of any
    size or nesting costs O(limit) and never recurses far (repr of a deep list would raise)."""
    out: list[str] = []
    _shown_into(out, value, limit + 1, 0)
    text = "".join(out)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _shown_into(out: list[str], value: object, room: int, depth: int) -> int:
    """Append value's repr to out until `room` characters are used; the room left."""
    if isinstance(value, (list, tuple, dict)):
        opening, closing = ("[", "]") if isinstance(value, list) else \
            ("(", ")") if isinstance(value, tuple) else ("{", "}")
        if depth >= _SHOWN_DEPTH and value:
            out.append(f"{opening}...{closing}")
            return room - 5
        out.append(opening)
        room -= 1
        pairs = value.items() if isinstance(value, dict) else ((None, item) for item in value)
        for index, (key, item) in enumerate(pairs):
            if room <= 0:
                return room
            if index:
                out.append(", ")
                room -= 2
            if isinstance(value, dict):
                room = _shown_into(out, key, room, depth + 1)
                out.append(": ")
                room -= 2
            room = _shown_into(out, item, room, depth + 1)
        if isinstance(value, tuple) and len(value) == 1:
            out.append(",")
            room -= 1
        out.append(closing)
        return room - 1
    if isinstance(value, (str, bytes)):
        text = repr(value[:max(room, 0) + 1])
    else:
        try:
            text = repr(value)[:max(room, 0) + 1]
        except (ValueError, RecursionError):  # an int of over 4300 digits; an odd object
            text = f"<{type(value).__name__}>"
    out.append(text)
    return room - len(text)
