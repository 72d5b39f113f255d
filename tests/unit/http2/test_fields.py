"""Malformed HTTP/2 header lists (RFC 9113 8.1.1, 8.2, 8.3), as the checks and the HPACK
decoder find them."""

from __future__ import annotations

import pytest

from serval.http2.fields import check_request, name_problem, trailers_problem, value_problem
from serval.http2.frames import COMPRESSION_ERROR, ProtocolError
from serval.http2.hpack import HpackDecoder, encode_headers

pytestmark = pytest.mark.unit

REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", "/p"), (":authority", "a"),
           ("content-type", "application/grpc"), ("te", "trailers")]


def test_a_well_formed_request_passes_with_its_content_length() -> None:
    assert check_request(REQUEST) == (None, -1)
    assert check_request([*REQUEST, ("content-length", "12")]) == (None, 12)
    assert check_request([(":method", "CONNECT"), (":authority", "h:1")]) == (None, -1)


@pytest.mark.parametrize("headers", [
    REQUEST[1:], [REQUEST[0], *REQUEST[2:]], [*REQUEST[:2], *REQUEST[3:]],
    [REQUEST[0], REQUEST[0], *REQUEST[1:]], [*REQUEST[:2], (":path", ""), *REQUEST[3:]],
    [*REQUEST[:3], ("x", "y"), (":authority", "a")], [(":status", "200"), *REQUEST],
    [*REQUEST[:3], ("te", "trailers"), (":authority", "a")],
    [*REQUEST[:3], ("content-length", "1"), (":authority", "a")],
    [*REQUEST, ("connection", "close")], [*REQUEST, ("te", "gzip")],
    [*REQUEST, ("content-length", "1"), ("content-length", "1")],
    [*REQUEST, ("content-length", "-1")], [*REQUEST, ("content-length", "\u0661")],
])
def test_malformed_requests_say_why(headers: list[tuple[str, str]]) -> None:
    problem, length = check_request(headers)
    assert problem and length == -1


def test_trailers_may_not_hold_pseudo_headers_or_connection_fields() -> None:
    assert trailers_problem([("x-a", "1")]) is None
    assert trailers_problem([(":path", "/")]) and trailers_problem([("upgrade", "x")])


def test_names_are_lower_case_tokens_and_values_hold_no_nul_cr_or_lf() -> None:
    assert name_problem("x-ok") is None and name_problem(":path") is None
    assert all(name_problem(name) for name in ("X-Up", "a b", "", "a:b", ":Path", "é"))
    assert value_problem("x", " spaced \t") is None
    assert all(value_problem("x", value) for value in ("a\rb", "a\nb", "a\x00b"))


def test_the_decoder_marks_a_malformed_block_and_never_caches_it() -> None:
    decoder = HpackDecoder()
    block = encode_headers([*REQUEST, ("X-Up", "a")])
    for _ in range(2):
        decoder.decode(block)
        assert decoder.malformed and "X-Up" in decoder.malformed
    decoder.decode(encode_headers(REQUEST))
    assert decoder.malformed is None


def test_referencing_a_malformed_table_entry_is_malformed_until_it_is_evicted() -> None:
    decoder = HpackDecoder(max_table_bytes=64)
    decoder.decode(b"\x40\x04X-Up\x01a")  # added to the dynamic table
    decoder.decode(b"\xbe")  # index 62: that entry
    assert decoder.malformed
    decoder.decode(b"\x40\x04x-ok\x01b")  # evicts it (64 bytes hold one entry)
    decoder.decode(b"\xbe")
    assert decoder.malformed is None


def test_a_table_size_update_after_a_field_is_a_compression_error() -> None:
    with pytest.raises(ProtocolError) as raised:
        HpackDecoder().decode(encode_headers(REQUEST) + b"\x20")
    assert raised.value.code == COMPRESSION_ERROR
    assert HpackDecoder().decode(b"\x20" + encode_headers(REQUEST)) == REQUEST
