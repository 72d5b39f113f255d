"""HTTP/2 frames (RFC 9113): the numbers, and building and reading frames."""

from __future__ import annotations

import struct
from collections.abc import Iterator

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER_BYTES = 9
DEFAULT_WINDOW_BYTES = 65_535
DEFAULT_MAX_FRAME_BYTES = 16_384
MAX_WINDOW_BYTES = 2**31 - 1
MAX_FRAME_BYTES = 2**24 - 1

# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9

# flags
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# settings identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6

# error codes
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x9, 0xB

_HEADER = struct.Struct(">BHBBL")  # length (24 bits as 8 + 16), type, flags, stream id
_SETTING = struct.Struct(">HL")
_U32 = struct.Struct(">L")


class ProtocolError(Exception):
    """The peer broke HTTP/2; the connection ends with GOAWAY(code)."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame as bytes."""
    size = len(payload)
    return _HEADER.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


def headers_frames(stream_id: int, block: bytes, flags: int, max_frame_bytes: int) -> bytes:
    """A header block as HEADERS and, past the peer's SETTINGS_MAX_FRAME_SIZE, CONTINUATION
    frames (RFC 9113 4.2, 6.10), to be written together; `flags` (END_STREAM) on the HEADERS."""
    if len(block) <= max_frame_bytes:
        return frame(HEADERS, flags | END_HEADERS, stream_id, block)
    parts = [frame(HEADERS, flags & ~END_HEADERS, stream_id, block[:max_frame_bytes])]
    for start in range(max_frame_bytes, len(block), max_frame_bytes):
        last = start + max_frame_bytes >= len(block)
        parts.append(frame(CONTINUATION, END_HEADERS if last else 0, stream_id,
                           block[start:start + max_frame_bytes]))
    return b"".join(parts)


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in settings.items()))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _U32.pack(last_stream_id) + _U32.pack(code) + debug)


def parse_settings(payload: bytes) -> dict[int, int]:
    """The settings of a SETTINGS frame, checked as RFC 9113 section 6.5.2 requires."""
    if len(payload) % 6:
        raise ProtocolError("SETTINGS payload is not a multiple of 6 bytes", FRAME_SIZE_ERROR)
    settings = dict(_SETTING.iter_unpack(payload))
    if settings.get(ENABLE_PUSH, 0) > 1:
        raise ProtocolError(f"SETTINGS_ENABLE_PUSH must be 0 or 1, not {settings[ENABLE_PUSH]}")
    frame_size = settings.get(MAX_FRAME_SIZE, DEFAULT_MAX_FRAME_BYTES)
    if not DEFAULT_MAX_FRAME_BYTES <= frame_size <= MAX_FRAME_BYTES:
        raise ProtocolError(f"SETTINGS_MAX_FRAME_SIZE {frame_size} outside "
                            f"{DEFAULT_MAX_FRAME_BYTES}..{MAX_FRAME_BYTES}")
    if settings.get(INITIAL_WINDOW_SIZE, 0) > MAX_WINDOW_BYTES:
        raise ProtocolError("SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1", FLOW_CONTROL_ERROR)
    return settings


def parse_u32(payload: bytes, what: str) -> int:
    """The 31-bit value of a 4-byte payload (RST_STREAM, WINDOW_UPDATE)."""
    if len(payload) != 4:
        raise ProtocolError(f"{what} frame of {len(payload)} bytes, not 4", FRAME_SIZE_ERROR)
    return int(_U32.unpack_from(payload)[0]) & 0x7FFF_FFFF


def check_dependency(priority: bytes, stream_id: int) -> None:
    """A priority block (PRIORITY's payload, HEADERS' with PRIORITY_FLAG) must not make a
    stream depend on itself (RFC 9113 5.3.1; a connection error here, as h2 makes it)."""
    if int(_U32.unpack_from(priority)[0]) & 0x7FFF_FFFF == stream_id:
        raise ProtocolError(f"stream {stream_id} depends on itself")


def strip_padding(flags: int, payload: bytes, priority_bytes: int = 0) -> bytes:
    """The frame's content without its padding (and HEADERS' priority block)."""
    start, end = 0, len(payload)
    if flags & PADDED:
        if not payload:
            raise ProtocolError("PADDED frame without a pad length")
        start, end = 1, end - payload[0]
    if flags & PRIORITY_FLAG:
        start += priority_bytes
    if end < start:
        raise ProtocolError("padding longer than the frame")
    return payload[start:end] if (start, end) != (0, len(payload)) else payload


class FrameReader:
    """Accumulates received bytes and yields complete frames (type, flags, stream, payload)."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.buffer = bytearray()
        self.max_frame_bytes = max_frame_bytes

    def feed(self, data: bytes) -> Iterator[tuple[int, int, int, bytes]]:
        buffer = self.buffer
        buffer += data
        offset, available = 0, len(buffer)
        unpack = _HEADER.unpack_from
        try:
            while available - offset >= FRAME_HEADER_BYTES:
                high, low, kind, flags, stream_id = unpack(buffer, offset)
                size = (high << 16) | low
                if size > self.max_frame_bytes:
                    raise ProtocolError(f"frame of {size} bytes exceeds the "
                                        f"{self.max_frame_bytes}-byte limit", FRAME_SIZE_ERROR)
                end = offset + FRAME_HEADER_BYTES + size
                if end > available:
                    break
                payload = bytes(buffer[offset + FRAME_HEADER_BYTES:end])
                offset = end
                yield kind, flags, stream_id & 0x7FFF_FFFF, payload
        finally:
            del buffer[:offset]
