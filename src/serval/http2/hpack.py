"""HPACK (RFC 7541): a decoder with a dynamic table and a cache of repeated header blocks,
and a table-free encoder (literal fields, never indexed) for the few headers we send.

Clients built on grpc-core send nearly identical header blocks on every call; once the dynamic
table holds them a block is a handful of index bytes, so a block decoded while the table did not
change is remembered and answered from a dict next time. Proxies (HAProxy) send the same bytes
on every call too, but as literals each added to the table again and never referenced: such a
block reads nothing from the dynamic table, so it decodes alike in any table state, and a
repeat of it is answered from the dict with its insertions replayed.

Bounds: a decoded header list larger than `max_list_bytes` (RFC 9113's SETTINGS_MAX_HEADER_LIST_SIZE
measure: name + value + 32 per field) is `HeaderListTooLarge`, raised once the whole block has
been processed (RFC 9113 10.5.1: the dynamic table must stay in step, so the connection can
answer that one stream and go on); a block of more than `MAX_FIELDS` fields stops decoding at
once (ENHANCE_YOUR_CALM), so the CPU spent on one block is bounded too. Only small blocks are
cached, and the cache is bounded in bytes. A table size update after a field is
COMPRESSION_ERROR (RFC 7541 4.2). Literal names and values are checked as they are read
(fields.py): `malformed` says why a block is malformed, such a block is never cached, and a
malformed field it added to the table stays malformed when referenced.
"""

from __future__ import annotations

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

from serval.http2.fields import name_problem, value_problem
from serval.http2.frames import COMPRESSION_ERROR, ENHANCE_YOUR_CALM, ProtocolError

Header = tuple[str, str]

_STATIC: tuple[Header, ...] = tuple(
    (name.decode("latin-1"), value.decode("latin-1")) for name, value in HeaderTable.STATIC_TABLE
)
_ENTRY_OVERHEAD_BYTES = 32
_CACHEABLE_BLOCK_BYTES = 512  # larger blocks are decoded every time
_CACHE_BYTES = 64 * 1024  # blocks and their decoded lists, per connection
_GOOD_NAMES = 256  # well-formed names remembered, so a name is checked once
MAX_FIELDS = 4096  # per block: 1-byte indexes decoded past this are an attack, not a request


class HeaderListTooLarge(ProtocolError):
    """A block decoded past the header-list limit: a stream error, the table is in step."""


class HpackDecoder:
    """One connection's decoding state."""

    def __init__(self, max_table_bytes: int = 4096, max_list_bytes: int = 1 << 30) -> None:
        self.max_table_bytes = max_table_bytes  # what we advertised (SETTINGS_HEADER_TABLE_SIZE)
        self.table_limit_bytes = max_table_bytes  # what the peer chose, <= max_table_bytes
        self.max_list_bytes = max_list_bytes
        self.table: list[Header] = []  # newest first
        self.table_bytes = 0
        self.generation = 0  # changes whenever the dynamic table does
        # block -> (its header list, the fields it adds to the table, the table generation it
        # is valid in: None for a block that reads nothing from the dynamic table)
        self._cache: dict[bytes, tuple[list[Header], list[Header], int | None]] = {}
        self._cache_bytes = 0
        self._read_dynamic = False  # set when the block being decoded reads the dynamic table
        # the size of the list the last decode built (0 when it came from the cache, where it
        # is shared with every other stream that sent the block): what a stream now holds
        self.last_list_bytes = 0
        # why the last block's names or values are malformed (RFC 9113 8.2.1), None when they
        # are not: the stream is refused, the block processed whole (never cached)
        self.malformed: str | None = None
        self._bad: set[Header] = set()  # malformed fields in the table: referencing one is too
        self._field_bad = False  # the last literal field read is malformed
        self._good_names: set[str] = set()  # literal names already found well-formed

    def decode(self, block: bytes) -> list[Header]:
        """The header list of one block; ProtocolError when it is malformed or too large."""
        self.malformed = None
        cached = self._cache.get(block)
        if cached is not None:
            headers, replay, valid_in = cached
            if valid_in is None:
                for name, value in replay:
                    self._insert(name, value)
                self.last_list_bytes = 0
                return headers
            if valid_in == self.generation:
                self.last_list_bytes = 0
                return headers
        generation = self.generation
        self._read_dynamic = False
        headers, list_bytes, inserts = self._decode(block)
        self.last_list_bytes = list_bytes
        if inserts is not None and len(block) <= _CACHEABLE_BLOCK_BYTES and (
                self.malformed is None):
            if not self._read_dynamic:
                self._remember(block, (headers, inserts, None), list_bytes)
            elif self.generation == generation:  # read the table and left it as it was
                self._remember(block, (headers, inserts, generation), list_bytes)
        return headers

    def _remember(self, block: bytes, entry: tuple[list[Header], list[Header], int | None],
                  list_bytes: int) -> None:
        cost = len(block) + list_bytes
        if self._cache_bytes + cost > _CACHE_BYTES:
            self._cache.clear()
            self._cache_bytes = 0
        self._cache[block] = entry
        self._cache_bytes += cost

    def _decode(self, block: bytes) -> tuple[list[Header], int, list[Header] | None]:
        """The header list, its size and the fields added to the table (None when the block
        also resized the table: such a block is not remembered)."""
        headers: list[Header] = []
        inserts: list[Header] | None = []
        pos, end = 0, len(block)
        size, limit, fields_left = 0, self.max_list_bytes, MAX_FIELDS
        try:
            while pos < end:
                fields_left -= 1
                if fields_left < 0:
                    raise ProtocolError(f"header block of more than {MAX_FIELDS} fields",
                                        ENHANCE_YOUR_CALM)
                byte = block[pos]
                if byte & 0x80:  # indexed field
                    index, pos = _integer(block, pos, 7)
                    name, value = entry = self._entry(index)
                    headers.append(entry)
                    size += len(name) + len(value) + _ENTRY_OVERHEAD_BYTES
                    continue
                if byte & 0x40:  # literal, added to the table
                    name, value, pos = self._literal(block, pos, 6)
                    headers.append((name, value))
                    self._insert(name, value)
                    if self._field_bad:  # referencing it later is malformed too
                        self._bad.add((name, value))
                    if inserts is not None:
                        inserts.append((name, value))
                elif byte & 0x20:  # dynamic table size update
                    if headers:  # RFC 7541 4.2: only at the start of a block
                        raise ProtocolError("HPACK table size update after a header field",
                                            COMPRESSION_ERROR)
                    table_bytes, pos = _integer(block, pos, 5)
                    if table_bytes > self.max_table_bytes:
                        raise ProtocolError(f"HPACK table size {table_bytes} above the "
                                            f"advertised {self.max_table_bytes}",
                                            COMPRESSION_ERROR)
                    self.table_limit_bytes = table_bytes
                    self._evict(0)
                    self.generation += 1
                    inserts = None
                    continue
                else:  # literal without indexing / never indexed
                    name, value, pos = self._literal(block, pos, 4)
                    headers.append((name, value))
                size += len(name) + len(value) + _ENTRY_OVERHEAD_BYTES
        except IndexError:
            raise ProtocolError("truncated HPACK block", COMPRESSION_ERROR) from None
        if size > limit:
            raise HeaderListTooLarge(f"header list of {size} bytes, larger than the {limit} "
                                     "this server accepts (--h2-max-header-list-bytes)",
                                     ENHANCE_YOUR_CALM)
        return headers, size, inserts

    def _literal(self, block: bytes, pos: int, prefix_bits: int) -> tuple[str, str, int]:
        index, pos = _integer(block, pos, prefix_bits)
        problem = None
        if index:
            name = self._entry(index)[0]
        else:
            name, pos = _string(block, pos)
            if name not in self._good_names:
                problem = name_problem(name)
                if problem is None and len(self._good_names) < _GOOD_NAMES:
                    self._good_names.add(name)
        value, pos = _string(block, pos)
        if not value.isprintable():  # (fast for the usual value; tabs and latin-1 look closer)
            problem = problem or value_problem(name, value)
        self._field_bad = problem is not None
        if problem is not None and self.malformed is None:
            self.malformed = problem
        return name, value, pos

    def _entry(self, index: int) -> Header:
        if 0 < index <= len(_STATIC):
            return _STATIC[index - 1]
        dynamic = index - len(_STATIC) - 1
        if 0 <= dynamic < len(self.table):
            self._read_dynamic = True
            entry = self.table[dynamic]
            if self._bad and entry in self._bad and self.malformed is None:
                self.malformed = f"field {entry[0][:40]!r} is malformed"
            return entry
        raise ProtocolError(f"HPACK index {index} out of range", COMPRESSION_ERROR)

    def _insert(self, name: str, value: str) -> None:
        size = len(name) + len(value) + _ENTRY_OVERHEAD_BYTES
        self.generation += 1
        if size > self.table_limit_bytes:
            self.table.clear()
            self._bad.clear()
            self.table_bytes = 0
            return
        self._evict(size)
        self.table.insert(0, (name, value))
        self.table_bytes += size

    def _evict(self, room_bytes: int) -> None:
        while self.table and self.table_bytes + room_bytes > self.table_limit_bytes:
            name, value = entry = self.table.pop()
            self.table_bytes -= len(name) + len(value) + _ENTRY_OVERHEAD_BYTES
            if self._bad and entry not in self.table:
                self._bad.discard(entry)


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
