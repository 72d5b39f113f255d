"""HPACK (RFC 7541): a decoder with a dynamic table and a cache of repeated header blocks,
and a table-free encoder (literal fields, never indexed) for the few headers we send.

Clients built on grpc-core send nearly identical header blocks on every call; once the dynamic
table holds them a block is a handful of index bytes, so a block decoded while the table did not
change is remembered and answered from a dict next time.
"""

from __future__ import annotations

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

from serval.http2.frames import COMPRESSION_ERROR, ProtocolError

Header = tuple[str, str]

_STATIC: tuple[Header, ...] = tuple(
    (name.decode("latin-1"), value.decode("latin-1")) for name, value in HeaderTable.STATIC_TABLE
)
_ENTRY_OVERHEAD_BYTES = 32
_CACHE_LIMIT = 512


class HpackDecoder:
    """One connection's decoding state."""

    def __init__(self, max_table_bytes: int = 4096) -> None:
        self.max_table_bytes = max_table_bytes  # what we advertised (SETTINGS_HEADER_TABLE_SIZE)
        self.table_limit_bytes = max_table_bytes  # what the peer chose, <= max_table_bytes
        self.table: list[Header] = []  # newest first
        self.table_bytes = 0
        self.generation = 0  # changes whenever the dynamic table does
        self._cache: dict[bytes, list[Header]] = {}

    def decode(self, block: bytes) -> list[Header]:
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        generation = self.generation
        headers = self._decode(block)
        if self.generation != generation:
            self._cache.clear()
        else:
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[block] = headers
        return headers

    def _decode(self, block: bytes) -> list[Header]:
        headers: list[Header] = []
        pos, end = 0, len(block)
        try:
            while pos < end:
                byte = block[pos]
                if byte & 0x80:  # indexed field
                    index, pos = _integer(block, pos, 7)
                    headers.append(self._entry(index))
                elif byte & 0x40:  # literal, added to the table
                    name, value, pos = self._literal(block, pos, 6)
                    headers.append((name, value))
                    self._insert(name, value)
                elif byte & 0x20:  # dynamic table size update
                    size, pos = _integer(block, pos, 5)
                    if size > self.max_table_bytes:
                        raise ProtocolError(f"HPACK table size {size} above the advertised "
                                            f"{self.max_table_bytes}", COMPRESSION_ERROR)
                    self.table_limit_bytes = size
                    self._evict(0)
                    self.generation += 1
                else:  # literal without indexing / never indexed
                    name, value, pos = self._literal(block, pos, 4)
                    headers.append((name, value))
        except IndexError:
            raise ProtocolError("truncated HPACK block", COMPRESSION_ERROR) from None
        return headers

    def _literal(self, block: bytes, pos: int, prefix_bits: int) -> tuple[str, str, int]:
        index, pos = _integer(block, pos, prefix_bits)
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = _string(block, pos)
        value, pos = _string(block, pos)
        return name, value, pos

    def _entry(self, index: int) -> Header:
        if 0 < index <= len(_STATIC):
            return _STATIC[index - 1]
        dynamic = index - len(_STATIC) - 1
        if 0 <= dynamic < len(self.table):
            return self.table[dynamic]
        raise ProtocolError(f"HPACK index {index} out of range", COMPRESSION_ERROR)

    def _insert(self, name: str, value: str) -> None:
        size = len(name) + len(value) + _ENTRY_OVERHEAD_BYTES
        self.generation += 1
        if size > self.table_limit_bytes:
            self.table.clear()
            self.table_bytes = 0
            return
        self._evict(size)
        self.table.insert(0, (name, value))
        self.table_bytes += size

    def _evict(self, room_bytes: int) -> None:
        while self.table and self.table_bytes + room_bytes > self.table_limit_bytes:
            name, value = self.table.pop()
            self.table_bytes -= len(name) + len(value) + _ENTRY_OVERHEAD_BYTES


def _integer(block: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    limit = (1 << prefix_bits) - 1
    value = block[pos] & limit
    pos += 1
    if value < limit:
        return value, pos
    shift = 0
    while True:
        byte = block[pos]
        pos += 1
        value += (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos
        if shift > 28:
            raise ProtocolError("HPACK integer too large", COMPRESSION_ERROR)


def _string(block: bytes, pos: int) -> tuple[str, int]:
    huffman = block[pos] & 0x80
    length, pos = _integer(block, pos, 7)
    raw = block[pos:pos + length]
    if len(raw) != length:
        raise IndexError
    if huffman:
        try:
            raw = decode_huffman(raw)
        except Exception as exc:  # hpack raises its own HPACKDecodingError
            raise ProtocolError(f"bad Huffman string: {exc}", COMPRESSION_ERROR) from None
    return raw.decode("latin-1"), pos + length


def encode_headers(headers: list[Header] | tuple[Header, ...]) -> bytes:
    """A header block of literal fields without indexing (no table state on either side)."""
    out = bytearray()
    for name, value in headers:
        out.append(0x00)
        _put_string(out, name.encode("latin-1"))
        _put_string(out, value.encode("latin-1"))
    return bytes(out)


def _put_string(out: bytearray, raw: bytes) -> None:
    _put_integer(out, len(raw), 7, 0x00)
    out += raw


def _put_integer(out: bytearray, value: int, prefix_bits: int, first_byte: int) -> None:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        out.append(first_byte | value)
        return
    out.append(first_byte | limit)
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
