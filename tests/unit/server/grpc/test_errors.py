"""The gRPC error table: every ErrorCode maps to the status that matches the HTTP table's answer."""

from __future__ import annotations

import grpc
import pytest

from serval.errors import ErrorCode
from serval.server.grpc.errors import GRPC_STATUS
from serval.server.http.errors import HTTP_STATUS

pytestmark = pytest.mark.unit


def test_both_transports_map_every_error_code_alike() -> None:
    pairs = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
             403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
             429: grpc.StatusCode.RESOURCE_EXHAUSTED, 500: grpc.StatusCode.INTERNAL,
             503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}
    assert set(HTTP_STATUS) == set(GRPC_STATUS) == set(ErrorCode)
    for code in ErrorCode:
        assert pairs[HTTP_STATUS[code]] is GRPC_STATUS[code], code
