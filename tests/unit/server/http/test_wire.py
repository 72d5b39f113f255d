"""HTTP/1.1 answers as bytes: the server's own header lines (serval-node) on every answer."""

from __future__ import annotations

import pytest

from serval.server.http.wire import NO_SERVER_HEADERS, ServerHeaders, encode_reply, refusal

pytestmark = pytest.mark.unit

NODE = ServerHeaders([(b"serval-node", b"node-a")])


def _head(answer: bytes) -> list[bytes]:
    return answer.partition(b"\r\n\r\n")[0].split(b"\r\n")


def test_own_lines_follow_the_status_line() -> None:
    answer = encode_reply((200, b"{}", [(b"content-type", b"application/json")]), True,
                          server_lines=NODE.lines)
    assert _head(answer) == [b"HTTP/1.1 200 OK", b"serval-node: node-a",
                             b"content-type: application/json", b"content-length: 2"]
    assert answer.endswith(b"\r\n\r\n{}")


def test_refusals_and_the_connection_limit_answer_carry_them() -> None:
    answer = encode_reply(refusal(431, "too many headers").reply, keep_alive=False,
                          server_lines=NODE.lines)
    assert b"serval-node: node-a" in _head(answer) and b"connection: close" in _head(answer)
    assert _head(NODE.at_limit)[:2] == [b"HTTP/1.1 503 Service Unavailable",
                                        b"serval-node: node-a"]


def test_without_own_headers_nothing_is_added() -> None:
    reply = (404, b"{}", [(b"content-type", b"application/json")])
    assert encode_reply(reply, True) == encode_reply(reply, True,
                                                     server_lines=NO_SERVER_HEADERS.lines)
    assert b"serval-node" not in NO_SERVER_HEADERS.at_limit
    assert NO_SERVER_HEADERS.at_limit.startswith(b"HTTP/1.1 503 ")
