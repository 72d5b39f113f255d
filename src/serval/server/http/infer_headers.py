"""An infer request's HTTP headers (Inference-Header-Content-Length, Content-Encoding,
Serval-Timeout-Ms), each refused with a precise 400 when malformed, and its body inflated
within the server's size limit (no decompression bombs)."""

from __future__ import annotations

import math
import re
import zlib

from serval.errors import InvalidInput
from serval.server.http.errors import BodyTooLarge

RawHeaders = list[tuple[bytes, bytes]]  # lower-case names, as received

MAX_TIMEOUT_MS = 86_400_000.0  # one day: a longer Serval-Timeout-Ms is a client mistake
_SHOWN_HEADER_BYTES = 64  # how much of a bad header value an error message quotes


def infer_headers(headers: RawHeaders) -> tuple[int | None, bytes, float | None]:
    """Inference-Header-Content-Length, Content-Encoding and Serval-Timeout-Ms."""
    header_length: int | None = None
    encoding = b""
    timeout_ms: float | None = None
    for key, value in headers:
        if key == b"inference-header-content-length":
            header_length = parse_header_length(value)
        elif key == b"content-encoding":
            encoding = value.strip().lower()
        elif key == b"serval-timeout-ms":
            timeout_ms = parse_timeout_ms(value)
    return header_length, encoding, timeout_ms


def _shown(value: bytes) -> str:
    """A client's header value for an error message: never raises, never long."""
    text = value[:_SHOWN_HEADER_BYTES].decode("utf-8", errors="backslashreplace")
    return f"'{text}{'...' if len(value) > _SHOWN_HEADER_BYTES else ''}'"


def parse_header_length(value: bytes) -> int:
    stripped = value.strip()
    if not stripped.isdigit() or len(stripped) > 19:  # ASCII digits only, int64 at most
        raise InvalidInput(
            "Inference-Header-Content-Length must be a non-negative integer (the JSON "
            f"header's size in bytes), got {_shown(value)}"
        )
    return int(stripped)


_DECIMAL = re.compile(rb"\s*(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?\s*")  # ASCII digits only


def parse_timeout_ms(value: bytes) -> float:
    # float() alone would take "1_000", "infinity" or non-ASCII digits
    parsed = float(value) if _DECIMAL.fullmatch(value) else math.nan
    if not 0 < parsed <= MAX_TIMEOUT_MS:  # NaN and inf fail here too
        raise InvalidInput(
            "Serval-Timeout-Ms must be a positive number of milliseconds, at most "
            f"{MAX_TIMEOUT_MS:.0f} (one day), got {_shown(value)}"
        )
    return parsed


def decompress(body: bytes, encoding: bytes, limit_bytes: int) -> bytes:
    """The body as sent, inflated for gzip/deflate up to limit_bytes (no decompression bombs)."""
    if encoding in (b"", b"identity"):
        return body
    if encoding not in (b"gzip", b"deflate"):
        raise InvalidInput(
            f"Content-Encoding {_shown(encoding)} is not supported; use gzip, deflate or identity"
        )
    name = encoding.decode("ascii")
    try:
        window = zlib.MAX_WBITS | 16 if encoding == b"gzip" else zlib.MAX_WBITS
        inflater = zlib.decompressobj(window)
        data = inflater.decompress(body, limit_bytes + 1)
        if len(data) > limit_bytes:
            raise BodyTooLarge(
                f"request body inflates to more than this server's limit of {limit_bytes} "
                "bytes (--max-request-mb)"
            )
        if not inflater.eof:
            raise EOFError("compressed data ends early")
    except (OSError, zlib.error, EOFError) as exc:
        raise InvalidInput(f"request body is not valid {name} data: {exc}") from None
    return data
