"""The one table from Serval errors to HTTP statuses, and the error bodies sent."""

from __future__ import annotations

import orjson

from serval.errors import BackendError, ErrorCode, InvalidInput, ServalError
from serval.observability.logging import report_internal_error

Headers = list[tuple[bytes, bytes]]
Reply = tuple[int, bytes, Headers]  # status, body, headers: a whole answer
JSON_HEADERS: Headers = [(b"content-type", b"application/json")]

HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_INPUT: 400,
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.MODEL_NOT_READY: 503,
    ErrorCode.OVERLOADED: 429,
    ErrorCode.DEADLINE_EXCEEDED: 504,
    ErrorCode.BACKEND_ERROR: 500,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNAUTHENTICATED: 401,
    ErrorCode.PERMISSION_DENIED: 403,
}


class BodyTooLarge(InvalidInput):
    """A body (after decompression) beyond --max-request-mb: HTTP 413."""


def method_not_allowed(method: str, what: str, allow: str) -> tuple[int, bytes, Headers]:
    """405 naming the method refused and, in `allow` (RFC 9110 15.5.6), those the route takes
    (GET routes take HEAD too)."""
    allowed = f"{allow}, HEAD" if "GET" in allow.split(", ") else allow
    return 405, error_body(f"method {method} not allowed for {what}"), [
        *JSON_HEADERS, (b"allow", allowed.encode())]


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})


def serval_error_response(exc: ServalError, route: str) -> tuple[int, bytes, Headers]:
    """Status, body and headers for a domain error; engine failures are logged, not echoed."""
    status = 413 if isinstance(exc, BodyTooLarge) else HTTP_STATUS[exc.code]
    headers = list(JSON_HEADERS)
    message = exc.message
    if exc.code is ErrorCode.BACKEND_ERROR:
        summary = exc.public_message if isinstance(exc, BackendError) else "internal error"
        message = report_internal_error(exc, route, summary, exc.message)
    if exc.code is ErrorCode.UNAUTHENTICATED:
        headers.append((b"www-authenticate", b"Bearer"))
    if exc.retry_after_s is not None:  # Overloaded; a worker held after crashes
        headers.append((b"retry-after", str(max(1, round(exc.retry_after_s))).encode()))
    return status, error_body(message), headers


def unexpected_error_response(exc: BaseException, route: str) -> tuple[int, bytes, Headers]:
    """A bug or unforeseen failure: 500 with a request id, traceback in the log."""
    message = report_internal_error(exc, route, "internal server error", repr(exc))
    return 500, error_body(message), list(JSON_HEADERS)
