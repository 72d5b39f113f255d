"""RFC 9112 / 9110 conformance of the HTTP/1.1 stack, raw bytes on a real server: HTTP
versions other than 1.1, HEAD, and framing that could be read two ways (smuggling)."""

from __future__ import annotations

import socket

import pytest

from tests.conftest import RunningServer
from tests.integration.test_generate import WORDS, WORDS_CONFIG
from tests.security.conftest import Factory, closed_within, connect, security_repository
from tests.security.http1_helpers import BODY, create_token, read_until, statuses
from tests.triton_python_models import write

pytestmark = pytest.mark.integration

LIVE = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n"


@pytest.fixture(scope="module")
def served(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = security_repository(tmp_path_factory.mktemp("http1-conformance"))
    write(root, "words", WORDS, WORDS_CONFIG)
    return server_factory(root, "--allow-python-models")


def _heads(data: bytes) -> list[bytes]:
    """The head (status line and headers) of each answer in `data`, lower-cased."""
    return [part.split(b"\r\n\r\n")[0].lower() for part in data.split(b"HTTP/1.1 ")[1:]]


def _answers(sock: socket.socket, count: int) -> bytes:
    return read_until(sock, lambda got: len(statuses(got)) >= count)


def test_an_http_1_0_keep_alive_answer_says_keep_alive(served: RunningServer) -> None:
    """Before: no `connection: keep-alive`, so a 1.0 client read the answer as ending at a
    close that never came (it waited for the keep-alive timeout)."""
    with connect(served.port) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        first = _answers(sock, 1)
        sock.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")  # the same connection serves
        rest = closed_within(sock, 5.0)
    assert b"connection: keep-alive" in _heads(first)[0]
    assert statuses(rest) == [200] and b"connection: close" in _heads(rest)[0]


def test_a_streamed_answer_to_http_1_0_is_not_chunked(served: RunningServer) -> None:
    """RFC 9112 7.1: no Transfer-Encoding to a 1.0 client; the body ends at the close."""
    body = b'{"text_input": "one two three"}'
    with connect(served.port) as sock:
        sock.sendall(b"POST /v2/models/words/generate_stream HTTP/1.0\r\nConnection: keep-alive"
                     b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        received = closed_within(sock, 10.0)
    head, _, events = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding" not in head.lower()
    assert b"connection: close" in head.lower()
    assert events.startswith(b"data: ") and events.count(b"data: ") == 3, events
    assert b"\r\n0\r\n" not in events


@pytest.mark.parametrize("request_line", [b"GET /v2/health/live HTTP/2.0",
                                          b"GET /v2/health/live HTTP/0.9"])
def test_other_http_versions_get_505(served: RunningServer, request_line: bytes) -> None:
    with connect(served.port) as sock:
        sock.sendall(request_line + b"\r\nHost: t\r\n\r\n" + LIVE)
        assert statuses(closed_within(sock, 5.0)) == [505]


def test_an_http_1_0_request_with_transfer_encoding_is_refused(served: RunningServer) -> None:
    """RFC 9112 6.1: faulty framing (a 1.0 proxy in front reads it otherwise); nginx: 400.
    Before, a 1.0 keep-alive request with a chunked body was read as chunked and kept the
    connection for what followed."""
    with connect(served.port) as sock:
        sock.sendall(b"POST /v2/models/linear/infer HTTP/1.0\r\nConnection: keep-alive\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                     % (len(BODY), BODY) + LIVE)
        assert statuses(closed_within(sock, 5.0)) == [400]


def test_head_answers_as_get_without_a_body(served: RunningServer) -> None:
    """RFC 9110 9.3.2 (load balancers probe with HEAD); before: 405."""
    with connect(served.port) as sock:
        sock.sendall(b"HEAD /v2/models/linear HTTP/1.1\r\nHost: t\r\n\r\n" + LIVE)
        received = read_until(sock, lambda got: got.count(b"HTTP/1.1 ") == 2
                              and got.endswith(b"\r\n\r\n"))
    head, _, rest = received.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert head.startswith(b"HTTP/1.1 200") and rest.startswith(b"HTTP/1.1 200")
    assert length > 0  # the length a GET's body has, and no body


SMUGGLING = {
    "content-length and transfer-encoding": b"Content-Length: 5\r\nTransfer-Encoding: chunked",
    "transfer-encoding then content-length": b"Transfer-Encoding: chunked\r\nContent-Length: 5",
    "two content-lengths": b"Content-Length: 5\r\nContent-Length: 5",
    "a content-length list": b"Content-Length: 5, 5",
    "a signed content-length": b"Content-Length: +5",
    "transfer-encoding chunked twice": b"Transfer-Encoding: chunked, chunked",
    "whitespace before the colon": b"Transfer-Encoding : chunked",
    "an obs-fold transfer-encoding": b"Content-Length: 5\r\nX: y\r\n Transfer-Encoding: chunked",
    "a bare CR in a value": b"X: a\rTransfer-Encoding: chunked",
}


@pytest.mark.parametrize("case", sorted(SMUGGLING))
def test_ambiguous_framing_is_refused_and_closed(served: RunningServer, case: str) -> None:
    """Each is read one way by some proxy and another by some server: 400, then the
    connection closes, so nothing after it can be read as a request of its own."""
    request = (b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: t\r\n" + SMUGGLING[case]
               + b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + LIVE)
    with connect(served.port) as sock:
        sock.sendall(request)
        assert statuses(closed_within(sock, 5.0)) == [400]


@pytest.mark.parametrize("chunks", [b"zz\r\nhello\r\n0\r\n\r\n",  # not hex
                                    b"5\r\nhelloXX0\r\n\r\n",  # no CRLF after the data
                                    b"5\nhello\n0\n\n",  # bare LF
                                    b"fffffffffffffffff1\r\nab\r\n0\r\n\r\n"])  # overflow
def test_bad_chunk_framing_is_refused_and_closed(served: RunningServer, chunks: bytes) -> None:
    with connect(served.port) as sock:
        sock.sendall(b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: t\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + chunks + LIVE)
        assert statuses(closed_within(sock, 5.0)) == [400]


def test_chunk_extensions_are_ignored(served: RunningServer) -> None:
    with connect(served.port) as sock:
        sock.sendall(b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: "
                     b"chunked\r\n\r\n%x;name=value;x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
                     + LIVE)
        assert statuses(_answers(sock, 2)) == [200, 200]


def test_absolute_form_targets_are_served(served: RunningServer) -> None:
    """RFC 9112 3.2.2: a server must accept the absolute form; the path is what counts."""
    with connect(served.port) as sock:
        sock.sendall(b"GET http://elsewhere/v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n" + LIVE)
        assert statuses(_answers(sock, 2)) == [200, 200]


def test_trailer_fields_are_not_merged_into_the_headers(served: RunningServer) -> None:
    """RFC 9110 6.5.1 (nginx and h11 drop them). Before, a Content-Encoding sent as a trailer,
    unseen by a proxy checking the headers, made the server inflate the body as gzip (400)."""
    with connect(served.port) as sock:
        sock.sendall(b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: "
                     b"chunked\r\n\r\n%x\r\n%s\r\n0\r\nContent-Encoding: gzip\r\nX-A: b\r\n\r\n"
                     % (len(BODY), BODY) + LIVE)
        assert statuses(_answers(sock, 2)) == [200, 200]


def test_head_is_authorized_as_get_even_with_a_body(server_factory: Factory,
                                                    tmp_path_factory: pytest.TempPathFactory
                                                    ) -> None:
    """The body-time authorization check must see the GET it is served as: a HEAD /metrics
    carrying a body, with no token, gets 401 as a GET would."""
    root = security_repository(tmp_path_factory.mktemp("http1-head-auth"))
    tokens = root.parent / f"{root.name}-tokens.yaml"
    create_token(tokens, "read")
    secured = server_factory(root, "--auth-tokens", str(tokens))
    with connect(secured.port) as sock:
        sock.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\nx"
                     b"HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
        received = closed_within(sock, 5.0)
    assert received.startswith(b"HTTP/1.1 401") and received.count(b"HTTP/1.1 ") == 1


@pytest.mark.parametrize(("request_head", "hosts"), [
    (b"GET /v2/health/live HTTP/1.1\r\n\r\n", 0),
    (b"GET /v2/health/live HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 2),
    (b"GET /v2/health/live HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n", 2)])
def test_a_request_without_one_host_is_refused(served: RunningServer, request_head: bytes,
                                                 hosts: int) -> None:
    """RFC 9112 3.2: an HTTP/1.1 request with no Host, or any request with several, is a 400
    (nginx's answer). Before, both were served: which host a request meant was a guess."""
    with connect(served.port) as sock:
        sock.sendall(request_head + LIVE)
        received = closed_within(sock, 5.0)
    assert statuses(received) == [400]
    assert f"has {hosts}".encode() in received and b"Host header" in received


def test_an_http_1_0_request_needs_no_host(served: RunningServer) -> None:
    with connect(served.port) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.0\r\n\r\n")
        assert statuses(closed_within(sock, 5.0)) == [200]
