"""The gRPC error table: every ErrorCode maps to the status that matches the HTTP table's answer."""

from __future__ import annotations

import pytest

from serval.errors import ErrorCode, InvalidInput, Overloaded
from serval.protocol.grpc.status import GrpcStatus
from serval.server.grpc.errors import GRPC_STATUS, grpc_error
from serval.server.http.errors import HTTP_STATUS

pytestmark = pytest.mark.unit


def test_both_transports_map_every_error_code_alike() -> None:
    pairs = {400: GrpcStatus.INVALID_ARGUMENT, 401: GrpcStatus.UNAUTHENTICATED,
             403: GrpcStatus.PERMISSION_DENIED, 404: GrpcStatus.NOT_FOUND,
             429: GrpcStatus.RESOURCE_EXHAUSTED, 500: GrpcStatus.INTERNAL,
             503: GrpcStatus.UNAVAILABLE, 504: GrpcStatus.DEADLINE_EXCEEDED}
    assert set(HTTP_STATUS) == set(GRPC_STATUS) == set(ErrorCode)
    for code in ErrorCode:
        assert pairs[HTTP_STATUS[code]] is GRPC_STATUS[code], code


def test_an_overload_refusal_says_when_to_retry_and_nothing_else_does() -> None:
    status, message, trailers = grpc_error(Overloaded("queue full", retry_after_s=1.5), "rpc")
    assert status is GrpcStatus.RESOURCE_EXHAUSTED and message == "queue full"
    assert trailers == (("grpc-retry-pushback-ms", "1500"),)
    assert grpc_error(Overloaded("busy", retry_after_s=0.0), "rpc")[2] == (
        ("grpc-retry-pushback-ms", "1"),)  # at least 1 ms, as Retry-After is at least 1 s
    assert grpc_error(InvalidInput("bad shape"), "rpc") == (
        GrpcStatus.INVALID_ARGUMENT, "bad shape", ())
