"""Header blocks of one HTTP/2 connection: HEADERS and its CONTINUATIONs into one block.

A block is capped in bytes as its frames arrive (the CONTINUATION flood, CVE-2024-27316), empty
HEADERS and CONTINUATION frames count against the abuse budget, and nothing else may come
between a HEADERS without END_HEADERS and its last CONTINUATION (RFC 9113 6.10).
"""

from __future__ import annotations

from serval.http2 import frames as h2
from serval.http2.abuse import AbuseBudget

Block = tuple[int, int, bytes]  # HEADERS flags, stream id, the whole header block


class HeaderBlocks:
    """The header block being assembled, if any; each call returns a completed block or None."""

    __slots__ = ("_abuse", "max_block_bytes", "open")

    def __init__(self, max_block_bytes: int, abuse: AbuseBudget) -> None:
        self.max_block_bytes = max_block_bytes
        self._abuse = abuse
        # a block waiting for CONTINUATION (the next frame must be one, on its stream): stream
        # id, flags, bytes so far; read on every frame, so a plain attribute
        self.open: tuple[int, int, bytearray] | None = None

    def headers(self, flags: int, stream_id: int, payload: bytes) -> Block | None:
        if stream_id == 0:
            raise h2.ProtocolError("HEADERS on stream 0")
        block = h2.strip_padding(flags, payload, priority_bytes=5)
        if flags & h2.PRIORITY_FLAG:  # (strip_padding has checked its 5 bytes are there)
            h2.check_dependency(payload[1:] if flags & h2.PADDED else payload, stream_id)
        if not block:
            self._abuse.control_frame("empty HEADERS")
        self._check(len(block))
        if flags & h2.END_HEADERS:
            return flags, stream_id, block
        self.open = (stream_id, flags, bytearray(block))
        return None

    def continuation(self, kind: int, flags: int, stream_id: int, payload: bytes) -> Block | None:
        assert self.open is not None
        first_stream, first_flags, block = self.open
        if kind != h2.CONTINUATION or stream_id != first_stream:
            raise h2.ProtocolError("expected CONTINUATION of the open header block")
        if not payload:
            self._abuse.control_frame("empty CONTINUATION")
        block += payload
        self._check(len(block))
        if not flags & h2.END_HEADERS:
            return None
        self.open = None
        return first_flags, stream_id, bytes(block)

    def _check(self, size: int) -> None:
        if size > self.max_block_bytes:
            raise h2.ProtocolError(f"header block over {self.max_block_bytes} bytes",
                                   h2.ENHANCE_YOUR_CALM)
