"""HTTP/1.1 answers as bytes: one buffer per response, and the refusals a connection ends with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus

from serval.server.http.app import Reply
from serval.server.http.errors import JSON_HEADERS, error_body

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}


def encode_reply(reply: Reply, keep_alive: bool, head: bool = False) -> bytes:
    """Status line, headers and body; a HEAD answer has the headers a GET would, and no body."""
    status, body, headers = reply
    parts = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} \r\n".encode()]
    parts += [b"%s: %s\r\n" % (name, value) for name, value in headers]
    parts.append(b"content-length: %d\r\n" % len(body))
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts += [b"\r\n", b"" if head else body]
    return b"".join(parts)


@dataclass(slots=True)
class Refusal:
    """An error answer that ends the connection, queued behind the requests read before it.

    linger: the client may still be sending (a body, the rest of its headers); stop writing,
    read and drop what arrives for a moment, then close, so the answer is not lost to a reset.
    """

    reply: Reply
    linger: bool = True
    message: str = ""  # for the log


def refusal(status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = (),
            linger: bool = True) -> Refusal:
    return Refusal((status, error_body(message), [*JSON_HEADERS, *headers]), linger, message)
