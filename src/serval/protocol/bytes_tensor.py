"""Tensors as raw bytes: little-endian fixed-size elements, or BYTES as length + payload."""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Sequence

import numpy as np

from serval.errors import InvalidInput
from serval.protocol.dtypes import numpy_dtype

_LENGTH = struct.Struct("<I")
_LITTLE_ENDIAN = ("<", "|", "=") if sys.byteorder == "little" else ("<", "|")


def decode_bytes_elements(raw: memoryview, expected_count: int, input_name: str) -> np.ndarray:
    """Parse length-prefixed elements into a 1-D object array of bytes.

    Stops at the element past expected_count: the work is bounded by what the shape
    declares, not by what the client sent (60 MiB of empty elements for a [1, 1] tensor).
    ~1 us an element: the transports call it on a thread for large tensors (a Python loop
    lets go of the GIL, so the event loop goes on)."""
    elements: list[bytes] = []
    offset, end = 0, len(raw)
    while offset < end:
        if len(elements) == expected_count:
            raise InvalidInput(
                f"input '{input_name}': shape needs {expected_count} BYTES elements, got more "
                f"than {expected_count} ({end - offset} bytes of data remain after element "
                f"{expected_count})"
            )
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
    return object_array(elements)


FILL_CHUNK = 1 << 16  # elements per C call: a thread filling an array lets go of the GIL between


def object_array(elements: Sequence[object]) -> np.ndarray:
    """A 1-D object array of the elements, filled a chunk at a time (one C call for 16M
    elements would hold the GIL ~0.2 s even on a thread)."""
    array = np.empty(len(elements), dtype=object)
    for start in range(0, len(elements), FILL_CHUNK):
        array[start:start + FILL_CHUNK] = elements[start:start + FILL_CHUNK]
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


def tensor_from_raw(
    raw: bytes | memoryview, start: int, size: int, datatype: str, shape: tuple[int, ...],
    name: str,
    size_source: str = "binary_data_size is",
) -> np.ndarray:
    """The tensor stored in raw[start:start+size] (no copy for fixed-size datatypes).

    size_source names where the size came from, for the error message.
    """
    count = math.prod(shape)
    if datatype == "BYTES":
        view = memoryview(raw)[start : start + size]
        return decode_bytes_elements(view, count, name).reshape(shape)
    check_raw_size(datatype, shape, size, name, size_source)
    return np.frombuffer(raw, dtype=numpy_dtype(datatype), count=count,
                         offset=start).reshape(shape)


def check_raw_size(datatype: str, shape: tuple[int, ...], size: int, name: str,
                   size_source: str) -> None:
    """InvalidInput unless `size` bytes are what a fixed-size tensor of this shape takes (any
    size may hold BYTES elements): asked before bytes are read from where `size` points."""
    if datatype == "BYTES":
        return
    expected = math.prod(shape) * numpy_dtype(datatype).itemsize
    if size != expected:
        raise InvalidInput(
            f"input '{name}': {datatype} shape {list(shape)} needs {expected} bytes, "
            f"{size_source} {size}"
        )


def tensor_to_raw(array: np.ndarray) -> bytes:
    """Row-major little-endian bytes of a tensor; BYTES elements length-prefixed."""
    if array.dtype == object or array.dtype.kind in ("U", "S"):
        return encode_bytes_elements(array)
    if array.dtype.byteorder in _LITTLE_ENDIAN and array.flags.c_contiguous:
        return array.tobytes()
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
