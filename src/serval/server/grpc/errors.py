"""The one table from Serval errors to gRPC status codes, and the trailers that go with them.

An overload refusal carries `grpc-retry-pushback-ms` (gRFC A6): how long the client should wait,
which grpc-core's retry policy honours (HTTP's Retry-After).
"""

from __future__ import annotations

from serval.errors import BackendError, ErrorCode, ServalError, UnsupportedCall
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


Trailers = tuple[tuple[str, str], ...]
RETRY_PUSHBACK = "grpc-retry-pushback-ms"


def grpc_error(exc: ServalError, rpc: str) -> tuple[GrpcStatus, str, Trailers]:
    """Status code, message and extra trailers for a domain error; engine failures are logged,
    not echoed."""
    if exc.code is ErrorCode.BACKEND_ERROR:
        summary = exc.public_message if isinstance(exc, BackendError) else "internal error"
        return GrpcStatus.INTERNAL, report_internal_error(exc, rpc, summary, exc.message), ()
    if isinstance(exc, UnsupportedCall):
        return GrpcStatus.UNIMPLEMENTED, exc.message, ()
    trailers: Trailers = ()
    if exc.retry_after_s is not None:  # Overloaded; a worker held after crashes
        trailers = ((RETRY_PUSHBACK, str(max(1, round(exc.retry_after_s * 1000)))),)
    return GRPC_STATUS[exc.code], exc.message, trailers


def unexpected_grpc_error(exc: Exception, rpc: str) -> tuple[GrpcStatus, str, Trailers]:
    """A bug or unforeseen failure: INTERNAL with a request id, traceback in the log."""
    return GrpcStatus.INTERNAL, report_internal_error(
        exc, rpc, "internal server error", repr(exc)
    ), ()
