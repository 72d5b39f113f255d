"""HTTP/2 framing: frames reassembled across any split, oversized frames, padding, settings
ranges."""

from __future__ import annotations

import pytest

from serval.http2 import frames as h2

pytestmark = pytest.mark.unit


def test_frame_reader_reassembles_frames_split_anywhere() -> None:
    stream = (h2.frame(h2.HEADERS, h2.END_HEADERS, 1, b"abc")
              + h2.frame(h2.DATA, h2.END_STREAM, 1, b"x" * 1000) + h2.window_update(0, 5))
    for cut in (1, 8, 9, 12, 500, len(stream) - 1):
        reader = h2.FrameReader(16_384)
        got = list(reader.feed(stream[:cut])) + list(reader.feed(stream[cut:]))
        assert [(kind, flags, sid, len(payload)) for kind, flags, sid, payload in got] == [
            (h2.HEADERS, h2.END_HEADERS, 1, 3), (h2.DATA, h2.END_STREAM, 1, 1000),
            (h2.WINDOW_UPDATE, 0, 0, 4)]


def test_oversized_frames_and_bad_settings_are_refused() -> None:
    with pytest.raises(h2.ProtocolError, match="exceeds"):
        list(h2.FrameReader(100).feed(h2.frame(h2.DATA, 0, 1, b"x" * 101)))
    with pytest.raises(h2.ProtocolError, match="multiple of 6"):
        h2.parse_settings(b"\x00\x04\x00")


def test_padding_is_stripped() -> None:
    assert h2.strip_padding(h2.PADDED, b"\x02data\x00\x00") == b"data"
    with pytest.raises(h2.ProtocolError):
        h2.strip_padding(h2.PADDED, b"\x09ab")


@pytest.mark.parametrize(("settings", "code"), [
    ({h2.MAX_FRAME_SIZE: 0}, h2.PROTOCOL_ERROR),
    ({h2.MAX_FRAME_SIZE: 2**24}, h2.PROTOCOL_ERROR),
    ({h2.ENABLE_PUSH: 2}, h2.PROTOCOL_ERROR),
    ({h2.INITIAL_WINDOW_SIZE: 2**31}, h2.FLOW_CONTROL_ERROR),
])
def test_settings_outside_their_ranges_are_errors(settings: dict[int, int], code: int) -> None:
    with pytest.raises(h2.ProtocolError) as raised:
        h2.parse_settings(h2.settings_frame(settings)[9:])
    assert raised.value.code == code
