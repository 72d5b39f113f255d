"""The one table from Serval errors to gRPC status codes."""

from __future__ import annotations

from serval.errors import BackendError, ErrorCode, ServalError
from serval.observability.logging import report_internal_error
from serval.protocol.grpc.status import GrpcStatus

GRPC_STATUS: dict[ErrorCode, GrpcStatus] = {
    ErrorCode.INVALID_INPUT: GrpcStatus.INVALID_ARGUMENT,
    ErrorCode.MODEL_NOT_FOUND: GrpcStatus.NOT_FOUND,
    ErrorCode.MODEL_NOT_READY: GrpcStatus.UNAVAILABLE,
    ErrorCode.OVERLOADED: GrpcStatus.RESOURCE_EXHAUSTED,
    ErrorCode.DEADLINE_EXCEEDED: GrpcStatus.DEADLINE_EXCEEDED,
    ErrorCode.BACKEND_ERROR: GrpcStatus.INTERNAL,
    ErrorCode.UNAVAILABLE: GrpcStatus.UNAVAILABLE,
    ErrorCode.UNAUTHENTICATED: GrpcStatus.UNAUTHENTICATED,
    ErrorCode.PERMISSION_DENIED: GrpcStatus.PERMISSION_DENIED,
}


def grpc_error(exc: ServalError, rpc: str) -> tuple[GrpcStatus, str]:
    """Status code and message for a domain error; engine failures are logged, not echoed."""
    if exc.code is ErrorCode.BACKEND_ERROR:
        summary = exc.public_message if isinstance(exc, BackendError) else "internal error"
        return GrpcStatus.INTERNAL, report_internal_error(exc, rpc, summary, exc.message)
    return GRPC_STATUS[exc.code], exc.message


def unexpected_grpc_error(exc: Exception, rpc: str) -> tuple[GrpcStatus, str]:
    """A bug or unforeseen failure: INTERNAL with a request id, traceback in the log."""
    return GrpcStatus.INTERNAL, report_internal_error(
        exc, rpc, "internal server error", repr(exc)
    )
