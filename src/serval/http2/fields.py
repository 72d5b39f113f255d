"""Malformed HTTP/2 requests (RFC 9113 8.1.1, 8.2, 8.3): what makes a decoded header list one.

A request's list starts with its pseudo-headers (:method, :scheme, :path, :authority; each at
most once, none but :authority empty; :scheme and :path present unless the method is
CONNECT), then regular fields; trailers have no pseudo-headers. Every name is lower-case token
characters, no value holds NUL, CR or LF (edge white space is let through, as nginx and Go
do), the connection-specific fields (Connection, Keep-Alive, Proxy-Connection,
Transfer-Encoding, Upgrade) are absent, TE may only say "trailers" and content-length is one
number (what the DATA must add up to). Each check says why a list is malformed, or None: the
stream is then reset with PROTOCOL_ERROR (a stream error, the connection goes on).
"""

from __future__ import annotations

import re

Header = tuple[str, str]

_PSEUDO_BITS = {":method": 1, ":scheme": 2, ":path": 4, ":authority": 8}
_CONNECTION_SPECIFIC = frozenset({"connection", "keep-alive", "proxy-connection",
                                  "transfer-encoding", "upgrade"})
_CHECKED_NAMES = _CONNECTION_SPECIFIC | {"te", "content-length"}
_BAD_NAME = re.compile(r"[^!#$%&'*+\-.^_`|~0-9a-z]")


def check_request(headers: list[Header]) -> tuple[str | None, int]:
    """Why a request's header list is malformed (None: it is not), and its content-length (-1:
    none), which its DATA must then add up to. (The characters of names and values are
    checked as HPACK decodes them: hpack.py.)"""
    seen = 0
    regular = False
    length = -1
    bits = _PSEUDO_BITS
    for name, value in headers:
        bit = bits.get(name)
        if bit is not None:
            if regular or seen & bit or not (value or bit == 8):
                return f"pseudo-header {name} after a regular field, twice or empty", -1
            seen |= bit
        elif name[:1] == ":":
            return f"pseudo-header {name[:40]} is not a request's", -1
        else:
            regular = True
            if name not in _CHECKED_NAMES:
                continue
            if name == "content-length":
                if not (value.isdigit() and value.isascii()) or length >= 0:
                    return "content-length not one decimal number", -1
                length = int(value)
                continue
            problem = _field_problem(name, value)
            if problem is not None:
                return problem, -1
    if not seen & 1:
        return "no :method pseudo-header", -1
    if seen & 6 != 6 and dict(headers)[":method"] != "CONNECT":
        return "no :scheme or no :path pseudo-header", -1
    return None, length


def trailers_problem(headers: list[Header]) -> str | None:
    """Why a trailer list is malformed (pseudo-headers are not allowed in one)."""
    for name, value in headers:
        problem = _field_problem(name, value)
        if problem is not None:
            return problem
    return None


def _field_problem(name: str, value: str) -> str | None:
    if name[:1] == ":":
        return f"pseudo-header {name[:40]} out of place (or not a request's)"
    if name in _CONNECTION_SPECIFIC:
        return f"connection-specific field {name}"
    if name == "te" and value != "trailers":
        return "TE other than 'trailers'"
    return None


def name_problem(name: str) -> str | None:
    """Why a literal field name is malformed: not lower-case token characters (a
    pseudo-header's after its colon)."""
    if not name or _BAD_NAME.search(name, 1 if name[0] == ":" else 0) is not None:
        return f"field name {name[:40]!r} is not a lower-case token"
    return None


def value_problem(name: str, value: str) -> str | None:
    if "\r" in value or "\n" in value or "\x00" in value:
        return f"the value of {name[:40]!r} holds NUL, CR or LF"
    return None
