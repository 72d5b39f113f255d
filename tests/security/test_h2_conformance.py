"""RFC 9113 / 7541 conformance in the style of h2spec, and gRPC's own rules, on a real server.

A malformed request (8.1.1, 8.2, 8.3) resets its stream with PROTOCOL_ERROR and the connection
serves on; HPACK and priority violations end the connection with the right GOAWAY code; gRPC
requests that are not gRPC, or carry a bad grpc-timeout or compression, get grpc-go's answers.
"""

from __future__ import annotations

import struct

import pytest

from serval.http2 import frames as h2
from serval.http2.hpack import HpackDecoder, encode_headers
from tests.conftest import RunningServer
from tests.security.h2_helpers import (
    SERVICE,
    RawH2,
    data,
    headers,
    infer_request,
    message,
)

pytestmark = pytest.mark.integration

REQUEST = [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "ModelInfer"),
           (":authority", "localhost"), ("content-type", "application/grpc"),
           ("te", "trailers")]
MESSAGE = message(infer_request())


def _without(name: str, *extra: tuple[str, str]) -> bytes:
    return encode_headers([field for field in REQUEST if field[0] != name] + list(extra))


def _with(*extra: tuple[str, str]) -> bytes:
    return encode_headers(REQUEST + list(extra))


def _replaced(name: str, value: str) -> bytes:
    return encode_headers([(key, value if key == name else old) for key, old in REQUEST])


def _literal_indexed(name: str, value: str) -> bytes:
    """A literal field added to the table (RFC 7541 6.2.1), name and value as given."""
    return (b"\x40" + bytes([len(name)]) + name.encode() + bytes([len(value)])
            + value.encode())


# name -> the frames of stream 1 (stream 3, well-formed, follows on the same connection)
MALFORMED: dict[str, bytes] = {
    "an upper-case field name": headers(1, _with(("X-Upper", "a"))) + data(1, MESSAGE, True),
    "a field name with a space": headers(1, _with(("x a", "b"))) + data(1, MESSAGE, True),
    "an empty field name": headers(1, _with(("", "b"))) + data(1, MESSAGE, True),
    "CR LF in a value": headers(1, _with(("x-a", "a\r\nx-b: c"))) + data(1, MESSAGE, True),
    "NUL in a value": headers(1, _with(("x-a", "a\x00b"))) + data(1, MESSAGE, True),
    "connection": headers(1, _with(("connection", "keep-alive"))) + data(1, MESSAGE, True),
    "keep-alive": headers(1, _with(("keep-alive", "5"))) + data(1, MESSAGE, True),
    "transfer-encoding": headers(1, _with(("transfer-encoding", "chunked")))
    + data(1, MESSAGE, True),
    "upgrade": headers(1, _with(("upgrade", "h2c"))) + data(1, MESSAGE, True),
    "te other than trailers": headers(1, _replaced("te", "gzip")) + data(1, MESSAGE, True),
    "no :method": headers(1, _without(":method")) + data(1, MESSAGE, True),
    "no :scheme": headers(1, _without(":scheme")) + data(1, MESSAGE, True),
    "no :path": headers(1, _without(":path")) + data(1, MESSAGE, True),
    "an empty :path": headers(1, _replaced(":path", "")) + data(1, MESSAGE, True),
    "two :path": headers(1, encode_headers([(":path", "/x"), *REQUEST]))
    + data(1, MESSAGE, True),
    "a pseudo-header after a field": headers(1, _without(":authority", (":authority", "x")))
    + data(1, MESSAGE, True),
    "an unknown pseudo-header": headers(1, encode_headers([(":foo", "x"), *REQUEST]))
    + data(1, MESSAGE, True),
    "a response pseudo-header": headers(1, encode_headers([(":status", "200"), *REQUEST]))
    + data(1, MESSAGE, True),
    "content-length below the data": headers(1, _with(("content-length", "3")))
    + data(1, MESSAGE, True),
    "content-length above the data": headers(1, _with(("content-length", str(len(MESSAGE) + 1))))
    + data(1, MESSAGE, True),
    "content-length and no data": headers(1, _with(("content-length", "7")), end_stream=True),
    "content-length not a number": headers(1, _with(("content-length", "+5")))
    + data(1, MESSAGE, True),
    "a pseudo-header in trailers": headers(1) + data(1, MESSAGE)
    + h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, encode_headers([(":path", "/")])),
    "connection in trailers": headers(1) + data(1, MESSAGE) + h2.frame(
        h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1, encode_headers([("connection", "x")])),
}


def test_content_length_is_checked_on_a_repeated_block(guarded: RunningServer) -> None:
    """The same header block again (the decoder's cache hands back the same list, whose check
    is remembered) still may not announce a body and send none."""
    block = _with(("content-length", str(len(MESSAGE))))
    with RawH2(guarded.grpc_port) as client:
        client.send(headers(1, block) + data(1, MESSAGE, True) + headers(3, block, True))
        for _ in range(50):
            if 3 in client.read(0.1).resets():
                break
        assert client.seen.statuses().get(1) == "0"
        assert client.seen.resets().get(3) == h2.PROTOCOL_ERROR


def _serves_stream_3(client: RawH2) -> None:
    client.send(headers(3) + data(3, MESSAGE, True))
    for _ in range(50):
        if client.read(0.1).statuses().get(3) == "0":
            break
    assert client.seen.statuses().get(3) == "0" and not client.seen.closed


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_request_resets_its_stream_only(guarded: RunningServer, case: str) -> None:
    """Before, every one of these was served as a well-formed call."""
    with RawH2(guarded.grpc_port) as client:
        client.send(MALFORMED[case])
        _serves_stream_3(client)
        assert client.seen.resets().get(1) == h2.PROTOCOL_ERROR
        assert 1 not in client.seen.statuses()


def test_a_table_entry_added_by_a_malformed_field_stays_malformed(
        guarded: RunningServer) -> None:
    """Referencing the dynamic table entry of an upper-case name later is malformed too."""
    indexed = 0x80 | (61 + 1)  # the newest dynamic entry
    with RawH2(guarded.grpc_port) as client:
        client.send(headers(1, encode_headers(REQUEST) + _literal_indexed("X-Up", "a"))
                    + data(1, MESSAGE, True))
        client.send(headers(5, encode_headers(REQUEST) + bytes([indexed]))
                    + data(5, MESSAGE, True))
        client.send(headers(7) + data(7, MESSAGE, True))
        for _ in range(50):
            if client.read(0.1).statuses().get(7) == "0":
                break
        assert client.seen.resets().get(1) == client.seen.resets().get(5) == h2.PROTOCOL_ERROR


@pytest.mark.parametrize("extra", [(), (("content-length", str(len(MESSAGE))),),
                                   (("x-spaced", " padded value "),)])
def test_well_formed_variants_are_served(guarded: RunningServer,
                                         extra: tuple[tuple[str, str], ...]) -> None:
    with RawH2(guarded.grpc_port) as client:
        client.send(headers(1, _without("te", *extra)) + data(1, MESSAGE, True))
        for _ in range(50):
            if 1 in client.read(0.1).statuses():
                break
        assert client.seen.statuses()[1] == "0"


# name -> (frames after SETTINGS, GOAWAY code)
CONNECTION_ERRORS: dict[str, tuple[bytes, int]] = {
    "an HPACK table size update after a field": (
        headers(1, encode_headers(REQUEST) + b"\x3f\xe1\x1f") + data(1, MESSAGE, True),
        h2.COMPRESSION_ERROR),
    "PRIORITY on itself": (h2.frame(h2.PRIORITY, 0, 3, struct.pack(">LB", 3, 16)),
                           h2.PROTOCOL_ERROR),
    "HEADERS depending on itself": (
        h2.frame(h2.HEADERS, h2.END_HEADERS | h2.PRIORITY_FLAG, 1,
                 struct.pack(">LB", 1, 16) + encode_headers(REQUEST)) + data(1, MESSAGE, True),
        h2.PROTOCOL_ERROR),
    "padded HEADERS depending on itself": (
        h2.frame(h2.HEADERS, h2.END_HEADERS | h2.PRIORITY_FLAG | h2.PADDED, 1,
                 b"\x02" + struct.pack(">LB", 1, 16) + encode_headers(REQUEST) + b"\x00\x00")
        + data(1, MESSAGE, True), h2.PROTOCOL_ERROR),
}


@pytest.mark.parametrize("case", sorted(CONNECTION_ERRORS))
def test_connection_errors_end_with_the_right_goaway(guarded: RunningServer, case: str) -> None:
    frames, code = CONNECTION_ERRORS[case]
    with RawH2(guarded.grpc_port) as client:
        client.send(frames)
        assert client.closed_with(3.0) == code


def _answer(client: RawH2, stream_id: int) -> dict[str, str]:
    """The fields of every HEADERS the server sent on the stream (table-free blocks)."""
    for _ in range(50):
        if stream_id in client.read(0.1).statuses():
            break
    return {name: value for kind, _, sid, payload in client.seen.frames
            if kind == h2.HEADERS and sid == stream_id
            for name, value in HpackDecoder().decode(payload)}


@pytest.mark.parametrize(("block", "status"), [
    (_replaced(":method", "GET"), "405"),
    (_replaced("content-type", "application/grpc-web"), "415"),
    (_replaced("content-type", "application/grpcx"), "415"),
])
def test_requests_that_are_not_grpc_get_an_http_status(guarded: RunningServer, block: bytes,
                                                       status: str) -> None:
    """Before, a GET or a grpc-web request was answered as gRPC (whose framing a grpc-web
    client misreads)."""
    with RawH2(guarded.grpc_port) as client:
        client.send(headers(1, block) + data(1, MESSAGE, True))
        assert _answer(client, 1).get(":status") == status


@pytest.mark.parametrize("timeout", ["abc", "-5S", "+5S", "123456789S", "9" * 300 + "H", "5",
                                     "5x"])
def test_a_malformed_grpc_timeout_is_refused(guarded: RunningServer, timeout: str) -> None:
    """INVALID_ARGUMENT (grpc-go: INTERNAL, kept here for the server's faults). Before, junk
    was ignored, '-5S' was a deadline in the past and 300 digits overflowed into an INTERNAL
    'internal server error' with a traceback in the log."""
    with RawH2(guarded.grpc_port) as client:
        client.send(headers(1, _with(("grpc-timeout", timeout))) + data(1, MESSAGE, True))
        answer = _answer(client, 1)
    assert answer["grpc-status"] == "3" and "malformed grpc-timeout" in answer["grpc-message"]


@pytest.mark.parametrize(("encoding", "flag", "status"), [
    (None, 1, "3"), ("identity", 1, "3"), ("gzip", 2, "3"), ("snappy", 1, "12")])
def test_compression_errors_get_precise_codes(guarded: RunningServer, encoding: str | None,
                                               flag: int, status: str) -> None:
    """A compressed flag without an encoding, or a flag of 2, is INVALID_ARGUMENT (grpc-go:
    INTERNAL); an encoding we lack is UNIMPLEMENTED and says which we have
    (grpc-accept-encoding). Before: all three UNIMPLEMENTED, none naming the encodings."""
    block = _with(("grpc-encoding", encoding)) if encoding else _with()
    with RawH2(guarded.grpc_port) as client:
        client.send(headers(1, block) + data(1, bytes([flag]) + MESSAGE[1:], True))
        answer = _answer(client, 1)
    assert answer["grpc-status"] == status
    if status == "12":
        assert set(answer["grpc-accept-encoding"].split(",")) >= {"gzip", "deflate"}


def _reset_code(client: RawH2, stream_id: int, then: bytes) -> int | None:
    """Send `then`, then a call on stream 9 (which must succeed); the reset stream_id got."""
    client.send(then + headers(9) + data(9, MESSAGE, True))
    for _ in range(50):
        if client.read(0.1).statuses().get(9) == "0":
            break
    assert client.seen.statuses().get(9) == "0" and not client.seen.closed
    return client.seen.resets().get(stream_id)


def test_data_on_a_stream_both_sides_closed_is_stream_closed(guarded: RunningServer) -> None:
    """RFC 9113 6.1 (h2spec 5.1: closed); before, it was dropped in silence."""
    with RawH2(guarded.grpc_port) as client:
        client.send(headers(1) + data(1, MESSAGE, True))
        for _ in range(50):
            if client.read(0.1).statuses().get(1) == "0":
                break
        assert _reset_code(client, 1, data(1, b"late")) == h2.STREAM_CLOSED


def test_data_after_the_clients_own_reset_is_stream_closed(guarded: RunningServer) -> None:
    with RawH2(guarded.grpc_port) as client:
        client.send(headers(1) + h2.rst_stream(1, h2.CANCEL))
        assert _reset_code(client, 1, data(1, b"late")) == h2.STREAM_CLOSED


def test_data_in_flight_on_a_stream_we_ended_is_dropped(guarded: RunningServer) -> None:
    """A call ended early (a message over the limit: RESOURCE_EXHAUSTED, RST_STREAM
    NO_ERROR): what the client sent before it learned is no error."""
    too_big = struct.pack(">BL", 0, 2**30)  # announced, far past --max-message-bytes
    with RawH2(guarded.grpc_port) as client:
        client.send(headers(1) + data(1, too_big))
        for _ in range(50):
            if 1 in client.read(0.1).statuses():
                break
        assert client.seen.statuses()[1] == "8"
        assert _reset_code(client, 1, data(1, b"x" * 1000)) == h2.NO_ERROR


@pytest.mark.parametrize(("method", "payload", "answers"), [
    ("ModelInfer", MESSAGE[:7], 0), ("ModelInfer", MESSAGE + MESSAGE[:3], 0),
    ("ModelStreamInfer", MESSAGE + MESSAGE[:7], 1), ("ModelStreamInfer", MESSAGE[:3], 0)])
def test_a_request_that_ends_inside_a_message_is_refused(
        guarded: RunningServer, method: str, payload: bytes, answers: int) -> None:
    """INVALID_ARGUMENT, naming the truncation (grpc-go: INTERNAL). Before, a stream's
    truncated last request was dropped in silence and the call ended OK."""
    block = _replaced(":path", SERVICE + method)
    with RawH2(guarded.grpc_port) as client:
        client.send(headers(1, block) + data(1, payload, True))
        answer = _answer(client, 1)
    assert answer["grpc-status"] == "3" and "inside a message" in answer["grpc-message"]
    assert len([f for f in client.seen.frames if f[0] == h2.DATA and f[2] == 1]) == answers


def test_trailers_in_flight_on_a_stream_we_ended_are_dropped(guarded: RunningServer) -> None:
    """An unknown method is answered at its headers (UNIMPLEMENTED, RST_STREAM NO_ERROR); the
    client's trailers, sent before it learned, ended the whole connection with a
    PROTOCOL_ERROR GOAWAY (every other call on it lost). RFC 9113 5.1: ignored."""
    with RawH2(guarded.grpc_port) as client:
        client.send(headers(1, _replaced(":path", SERVICE + "NoSuchMethod")))
        for _ in range(50):
            if 1 in client.read(0.1).statuses():
                break
        assert client.seen.statuses()[1] == "12"
        trailers = h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1,
                            encode_headers([("x-checksum", "1")]))
        assert _reset_code(client, 1, data(1, MESSAGE) + trailers) == h2.NO_ERROR


def test_a_long_trailer_block_is_split_to_the_clients_frame_size(guarded: RunningServer) -> None:
    """An unknown 30 KB method name comes back in grpc-message: before, as one 30 KB HEADERS
    frame, past the client's 16 KiB SETTINGS_MAX_FRAME_SIZE (a conformant client ends the
    connection with FRAME_SIZE_ERROR); now HEADERS + CONTINUATION, each within it."""
    block = _replaced(":path", "/" + "p" * 30_000)
    with RawH2(guarded.grpc_port) as client:
        client.send(headers(1, block) + data(1, MESSAGE, True))
        for _ in range(50):
            client.read(0.1)
            if any(kind in (h2.HEADERS, h2.CONTINUATION) and flags & h2.END_HEADERS
                   and sid == 1 for kind, flags, sid, _ in client.seen.frames):
                break
    frames = [(kind, flags, payload) for kind, flags, sid, payload in client.seen.frames
              if sid == 1 and kind in (h2.HEADERS, h2.CONTINUATION)]
    assert all(len(payload) <= h2.DEFAULT_MAX_FRAME_BYTES for _, _, payload in frames)
    assert [kind for kind, _, _ in frames] == [h2.HEADERS] + [h2.CONTINUATION] * (
        len(frames) - 1) and len(frames) > 1
    assert frames[0][1] & h2.END_STREAM and frames[-1][1] & h2.END_HEADERS
    answer = dict(HpackDecoder().decode(b"".join(payload for _, _, payload in frames)))
    assert answer["grpc-status"] == "12" and len(answer["grpc-message"]) > 30_000
