"""GrpcStatus: Serval's one spelling of gRPC status codes, checked against grpcio's own table."""

from __future__ import annotations

import grpc
import pytest

from serval.protocol.grpc.status import GrpcStatus

pytestmark = pytest.mark.unit


def test_every_code_has_grpcios_name_and_number() -> None:
    theirs = {code.name: code.value[0] for code in grpc.StatusCode}
    assert {status.name: int(status) for status in GrpcStatus} == theirs

