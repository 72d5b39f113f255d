"""The one table from Serval errors to gRPC status codes."""

from __future__ import annotations

import grpc

from serval.errors import BackendError, ErrorCode, ServalError
from serval.observability.logging import report_internal_error

GRPC_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_INPUT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.MODEL_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.MODEL_NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.OVERLOADED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.BACKEND_ERROR: grpc.StatusCode.INTERNAL,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}


def grpc_error(exc: ServalError, rpc: str) -> tuple[grpc.StatusCode, str]:
    """Status code and message for a domain error; engine failures are logged, not echoed."""
    if exc.code is ErrorCode.BACKEND_ERROR:
        summary = exc.public_message if isinstance(exc, BackendError) else "internal error"
        return grpc.StatusCode.INTERNAL, report_internal_error(exc, rpc, summary, exc.message)
    return GRPC_STATUS[exc.code], exc.message


def unexpected_grpc_error(exc: Exception, rpc: str) -> tuple[grpc.StatusCode, str]:
    """A bug or unforeseen failure: INTERNAL with a request id, traceback in the log."""
    return grpc.StatusCode.INTERNAL, report_internal_error(
        exc, rpc, "internal server error", repr(exc)
    )
