"""gRPC stream helpers: grpc-message percent-encoding."""

from __future__ import annotations

import pytest

from serval.http2.hpack import HpackDecoder
from serval.server.grpc.stream import ResponseHeaders, percent_encode

pytestmark = pytest.mark.unit


def test_grpc_message_percent_encoding() -> None:
    assert percent_encode("shape [1, 2] given") == "shape [1, 2] given"
    assert percent_encode("100% é\n") == "100%25 %C3%A9%0A"


def test_response_headers_are_one_table_free_block() -> None:
    own = (("serval-node", "node-a"),)
    headers = ResponseHeaders(own)
    assert headers.own == own
    # table-free: two decoders (two connections) read the same block alike, again and again
    for decoder in (HpackDecoder(), HpackDecoder()):
        for _ in range(2):
            assert decoder.decode(headers.block) == [
                (":status", "200"), ("content-type", "application/grpc"), *own]
    assert HpackDecoder().decode(ResponseHeaders().block) == [
        (":status", "200"), ("content-type", "application/grpc")]
