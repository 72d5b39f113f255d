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


# HAProxy's h2 encoder sends the same bytes on every call: :authority, :path and content-type
# as literals added to the dynamic table, which it never references
PROXY_BLOCK = bytes.fromhex(
    "8386410f3132372e302e302e313a3332303031442a2f696e666572656e63652e47525043496e666572656e"
    "6365536572766963652f4d6f64656c496e6665725f106170706c69636174696f6e2f677270630002746508"
    "747261696c657273")


def test_a_repeated_block_that_only_adds_to_the_table_is_cached_and_replays_its_insertions(
) -> None:
    reference, decoder = Decoder(), HpackDecoder()
    decoded = []
    original = decoder._decode
    decoder._decode = lambda block: decoded.append(block) or original(block)  # type: ignore
    for _ in range(200):  # 3 insertions a call: the 4,096-byte table fills and evicts
        assert decoder.decode(PROXY_BLOCK) == reference.decode(PROXY_BLOCK)
    assert len(decoded) == 1
    # the table is in step with the reference: blocks that index it read the same fields
    for index in (62, 63, 64, 62 + len(decoder.table) - 1):
        block = bytes([0x80 | 0x7F, index - 127]) if index >= 127 else bytes([0x80 | index])
        assert decoder.decode(block) == reference.decode(block)
    assert [(n.encode(), v.encode()) for n, v in decoder.table] == list(reference.header_table
                                                                         .dynamic_entries)


def test_a_block_that_reads_the_table_is_not_replayed_once_the_table_changed() -> None:
    encoder, decoder = Encoder(), HpackDecoder()
    first = encoder.encode([("x-a", "1")])  # adds x-a: 1 (index 62)
    decoder.decode(first)
    indexed_and_adding = bytes([0x80 | 62]) + b"\x40\x03x-b\x012"  # reads 62, adds x-b: 2
    assert decoder.decode(indexed_and_adding) == [("x-a", "1"), ("x-b", "2")]
    # x-b: 2 is now 62: the same bytes read it, and add x-b: 2 again
    assert decoder.decode(indexed_and_adding) == [("x-b", "2"), ("x-b", "2")]
