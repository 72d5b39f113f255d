"""The sizes a chunked request body announces, read alongside the HTTP parser.

httptools checks the framing but does not say what a chunk-size line announced, so a chunk of
1 TB would be read until its bytes passed the body limit. `ChunkSizes` reads each size line as
it arrives (the body from its first byte, as the parser is fed) so the reader can refuse the
body (413) before any of that chunk's bytes. It judges nothing else: a line it cannot read
stops it, and the parser refuses that framing itself (llhttp is strict: CRLF line ends, hex
sizes, no spaces).
"""

from __future__ import annotations

import re

_HEX = re.compile(rb"[0-9A-Fa-f]+")
_MAX_LINE = 1024  # a size line longer than this is the parser's to refuse (chunk extensions)


class ChunkSizes:
    """Chunk-size lines of one chunked body, fed the body's bytes in order."""

    __slots__ = ("active", "announced", "line", "skip")

    def __init__(self) -> None:
        self.active = False
        self.announced = 0  # bytes the chunks read so far announce, all together
        self.line = b""  # a size line not yet complete
        self.skip = 0  # chunk data (and its CRLF) still to pass over

    def start(self) -> None:
        """The next byte fed is the body's first."""
        self.active, self.announced, self.line, self.skip = True, 0, b"", 0

    def stop(self) -> None:
        self.active = False

    def feed(self, data: bytes | memoryview) -> int:
        """Read these body bytes (before the parser does); the total the chunks announced so
        far, the one whose size line just arrived included."""
        position, end = 0, len(data)
        while self.active and position < end:
            if self.skip:
                step = min(self.skip, end - position)
                position += step
                self.skip -= step
                continue
            line_end = bytes(data[position:position + _MAX_LINE]).find(b"\n")
            if line_end < 0:
                self.line += bytes(data[position:])
                if len(self.line) > _MAX_LINE:
                    self.active = False
                return self.announced
            line = self.line + bytes(data[position:position + line_end])
            self.line, position = b"", position + line_end + 1
            digits = _HEX.match(line)
            if digits is None:
                self.active = False  # not a size line: the parser refuses it
                return self.announced
            size = int(digits.group(), 16)
            if size == 0:
                self.active = False  # the last chunk: trailers follow, nothing more to count
                return self.announced
            self.announced += size
            self.skip = size + 2  # the data, then its CRLF
        return self.announced
