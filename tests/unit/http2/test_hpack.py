"""HPACK: our decoder against the hpack library's encoder, bounded header lists and block cache."""

from __future__ import annotations

import random

import pytest
from hpack import Decoder, Encoder

from serval.http2 import frames as h2
from serval.http2.hpack import HeaderListTooLarge, HpackDecoder, encode_headers

pytestmark = pytest.mark.unit


def _random_headers(rng: random.Random, index: int) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":path", "/inference.GRPCInferenceService/ModelInfer"),
            ("grpc-timeout", f"{rng.randint(1, 99_999)}m"),
            (f"x-meta-{index % 40}", "v" * rng.randint(0, 400)),
            ("content-type", "application/grpc")]


@pytest.mark.parametrize("table_bytes", [4096, 256, 0])
def test_decoder_follows_an_indexing_encoder_through_evictions(table_bytes: int) -> None:
    rng = random.Random(table_bytes)
    encoder, decoder = Encoder(), HpackDecoder()
    encoder.header_table_size = table_bytes  # emits a table size update in the next block
    for index in range(1_500):
        headers = _random_headers(rng, index)
        assert decoder.decode(encoder.encode(headers, huffman=index % 2 == 0)) == headers
    assert decoder.table_bytes <= table_bytes


def test_cached_blocks_are_not_reused_after_the_table_changes() -> None:
    encoder, decoder = Encoder(), HpackDecoder()
    decoder.decode(encoder.encode([("x-a", "1")]))  # x-a: 1 now at dynamic index 62
    indexed = bytes([0x80 | 62])
    assert decoder.decode(indexed) == [("x-a", "1")]
    decoder.decode(encoder.encode([("x-b", "2")]))  # x-b: 2 takes index 62
    assert decoder.decode(indexed) == [("x-b", "2")]


@pytest.mark.parametrize("block", [b"\x82\x84\x40", b"\xff", b"\xbf\x80", b"\x00\x85ab"])
def test_truncated_or_out_of_range_blocks_are_protocol_errors(block: bytes) -> None:
    with pytest.raises(h2.ProtocolError):
        HpackDecoder().decode(block)


def test_our_literal_encoding_decodes_with_the_reference_decoder() -> None:
    headers = [(":status", "200"), ("content-type", "application/grpc"),
               ("grpc-message", "x" * 300)]
    assert Decoder().decode(encode_headers(headers)) == headers


def test_blocks_of_too_many_fields_stop_decoding() -> None:
    decoder = HpackDecoder(max_list_bytes=1000)
    with pytest.raises(h2.ProtocolError) as raised:
        decoder.decode(b"\x82" * 100_000)  # one-byte indexes: 42 bytes each once decoded
    assert raised.value.code == h2.ENHANCE_YOUR_CALM
    assert not isinstance(raised.value, HeaderListTooLarge)  # an attack: the connection ends
    assert decoder.decode(b"\x82" * 20) == [(":method", "GET")] * 20  # under the limit


def test_a_list_past_the_limit_is_processed_whole_so_the_table_stays_in_step() -> None:
    encoder = Encoder()  # the hpack library's: it indexes what it sends
    decoder = HpackDecoder(max_list_bytes=1000)
    with pytest.raises(HeaderListTooLarge, match="larger than the 1000"):
        decoder.decode(encoder.encode([("x-big", "v" * 2000), ("x-after", "kept")]))
    # the next block refers to both entries by index: the table must hold them
    assert decoder.decode(encoder.encode([("x-after", "kept")])) == [("x-after", "kept")]


def test_the_block_cache_is_bounded_in_bytes() -> None:
    decoder = HpackDecoder()
    for n in range(5000):
        decoder.decode(encode_headers([("x-n", str(n))]))
    assert decoder._cache_bytes <= 64 * 1024
    decoder.decode(encode_headers([("x-big", "v" * 4000)]))
    assert encode_headers([("x-big", "v" * 4000)]) not in decoder._cache  # too big to keep
