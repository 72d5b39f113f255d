"""BYTES tensors on the wire: 4-byte little-endian length + payload per element."""

from __future__ import annotations

import struct

import numpy as np

from serval.errors import InvalidInput

_LENGTH = struct.Struct("<I")


def decode_bytes_elements(raw: memoryview, expected_count: int, input_name: str) -> np.ndarray:
    """Parse length-prefixed elements into a 1-D object array of bytes."""
    elements: list[bytes] = []
    offset, end = 0, len(raw)
    while offset < end:
        if offset + 4 > end:
            raise InvalidInput(f"input '{input_name}': BYTES data ends inside an element length")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > end:
            raise InvalidInput(
                f"input '{input_name}': BYTES element of {length} bytes overruns its data"
            )
        elements.append(bytes(raw[offset : offset + length]))
        offset += length
    if len(elements) != expected_count:
        raise InvalidInput(
            f"input '{input_name}': shape needs {expected_count} BYTES elements, "
            f"got {len(elements)}"
        )
    array = np.empty(len(elements), dtype=object)
    array[:] = elements
    return array


def encode_bytes_elements(array: np.ndarray) -> bytes:
    """Serialise an array of bytes/str elements, row-major, length-prefixed."""
    parts: list[bytes] = []
    for element in array.ravel():
        data = as_bytes(element)
        parts.append(_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def as_bytes(element: object) -> bytes:
    """One BYTES element as bytes (engines may hand back str)."""
    if isinstance(element, bytes):
        return element
    if isinstance(element, str):
        return element.encode("utf-8")
    return str(element).encode("utf-8")


def as_text(element: object) -> str:
    """One BYTES element as JSON text (invalid UTF-8 is replaced, never raised)."""
    if isinstance(element, bytes):
        return element.decode("utf-8", errors="replace")
    return str(element)
