"""gRPC stream helpers: grpc-message percent-encoding."""

from __future__ import annotations

import pytest

from serval.server.grpc.stream import percent_encode

pytestmark = pytest.mark.unit


def test_grpc_message_percent_encoding() -> None:
    assert percent_encode("shape [1, 2] given") == "shape [1, 2] given"
    assert percent_encode("100% é\n") == "100%25 %C3%A9%0A"
