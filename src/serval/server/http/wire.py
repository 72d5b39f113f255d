"""HTTP/1.1 answers as bytes: one buffer per response, and the refusals a connection ends with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus

from serval.server.http.errors import JSON_HEADERS, Reply, error_body

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_STATUS_LINES = {s.value: f"HTTP/1.1 {s.value} {s.phrase}\r\n".encode() for s in HTTPStatus}


def encode_reply(reply: Reply, keep_alive: bool, head: bool = False,
                 server_lines: bytes = b"", http10: bool = False) -> bytes:
    """Status line, headers and body; a HEAD answer has the headers a GET would, and no body.

    `server_lines`: the server's own header lines (ServerHeaders.lines), already encoded;
    `http10`: the request was HTTP/1.0, whose keep-alive must be said (else the client waits
    for the connection to close)."""
    status, body, headers = reply
    parts = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} \r\n".encode(), server_lines]
    parts += [b"%s: %s\r\n" % (name, value) for name, value in headers]
    parts.append(b"content-length: %d\r\n" % len(body))
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    elif http10:
        parts.append(b"connection: keep-alive\r\n")
    parts += [b"\r\n", b"" if head else body]
    return b"".join(parts)


def encode_stream_head(status: int, headers: Sequence[tuple[bytes, bytes]], keep_alive: bool,
                       server_lines: bytes = b"", chunked: bool = True) -> bytes:
    """The head of an answer whose body follows in chunks (encode_chunk, then LAST_CHUNK), or,
    not `chunked` (an HTTP/1.0 client, RFC 9112 7.1), as is until the connection closes."""
    parts = [_STATUS_LINES.get(status) or f"HTTP/1.1 {status} \r\n".encode(), server_lines]
    parts += [b"%s: %s\r\n" % (name, value) for name, value in headers]
    if chunked:
        parts.append(b"transfer-encoding: chunked\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def encode_chunk(data: bytes) -> bytes:
    """One chunk of a chunked body; `data` must not be empty (that would end the body)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


class ServerHeaders:
    """The headers every answer of one server carries (serval-node), encoded once as it starts,
    and the answer a connection past --max-connections gets, with them."""

    __slots__ = ("at_limit", "lines")

    def __init__(self, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        self.lines = b"".join(b"%s: %s\r\n" % (name, value) for name, value in headers)
        self.at_limit = encode_reply((503, _AT_LIMIT_BODY, [*JSON_HEADERS]), keep_alive=False,
                                     server_lines=self.lines)


_AT_LIMIT_BODY = error_body("the server is at its connection limit (--max-connections); "
                            "retry shortly")
NO_SERVER_HEADERS = ServerHeaders()


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
