"""gRPC stream helpers: grpc-message percent-encoding, response header blocks, the frames of a
unary reply."""

from __future__ import annotations

import pytest

from serval.http2 import frames as h2
from serval.http2.frames import FrameReader
from serval.http2.hpack import HpackDecoder
from serval.protocol.grpc.status import GrpcStatus
from serval.server.grpc.stream import CallFailed, ResponseHeaders, ServerCall, percent_encode
from serval.server.limits import ReceiveBudget

pytestmark = pytest.mark.unit


def test_grpc_message_percent_encoding() -> None:
    assert percent_encode("shape [1, 2] given") == "shape [1, 2] given"
    assert percent_encode("100% é\n") == "100%25 %C3%A9%0A"


def test_response_headers_are_one_table_free_block() -> None:
    own = (("serval-node", "node-a"),)
    headers = ResponseHeaders(own)
    assert headers.own == own
    # table-free: two decoders (two connections) read the same block alike, again and again
    for decoder in (HpackDecoder(), HpackDecoder()):
        for _ in range(2):
            assert decoder.decode(headers.block) == [
                (":status", "200"), ("content-type", "application/grpc"), *own]
    assert HpackDecoder().decode(ResponseHeaders().block) == [
        (":status", "200"), ("content-type", "application/grpc")]


class Owner:
    """A CallOwner that takes every frame at once (open windows) and records the bytes."""

    def __init__(self) -> None:
        self.response_headers = ResponseHeaders((("serval-node", "n"),))
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def send_pending(self, call: ServerCall) -> None:
        frames, _ = call.take_sendable(1 << 20, 1 << 14)
        self.written += frames

    def consumed(self, call: ServerCall, size: int) -> None:
        pass


def _call(owner: Owner) -> ServerCall:
    return ServerCall(owner, 1, [], received_ns=0, send_window=1 << 20, receive_window=1 << 16,
                      max_message_bytes=1 << 20, max_messages=8, budget=ReceiveBudget(1 << 20))


def _frames(data: bytes) -> list[tuple[int, int, list[tuple[str, str]] | bytes]]:
    out: list[tuple[int, int, list[tuple[str, str]] | bytes]] = []
    decoder = HpackDecoder()
    for kind, flags, _, payload in FrameReader(1 << 14).feed(data):
        out.append((kind, flags, decoder.decode(payload) if kind == h2.HEADERS else payload))
    return out


def test_a_unary_reply_is_what_a_message_then_ok_would_be_in_one_pass() -> None:
    one, two = Owner(), Owner()
    _call(one).send_reply(b"payload")
    call = _call(two)
    call.send_message(b"payload")
    call.finish(GrpcStatus.OK)
    assert b"".join(one.written) == b"".join(two.written)
    frames = _frames(b"".join(one.written))
    assert [(kind, flags) for kind, flags, _ in frames] == [
        (h2.HEADERS, h2.END_HEADERS), (h2.DATA, 0),
        (h2.HEADERS, h2.END_HEADERS | h2.END_STREAM)]
    assert frames[1][2] == b"\x00\x00\x00\x00\x07payload"
    assert frames[2][2] == [("grpc-status", "0")]


def test_a_call_holds_the_bytes_it_has_received_not_those_announced() -> None:
    """The budget counts what arrived: a prefix announcing 1 MiB holds 5 bytes; a message
    whole in one frame, and one assembled from pieces, each hold their size until read; the
    header list until the call ends; an announced message that could never fit is refused
    when announced."""
    budget = ReceiveBudget(1 << 20)
    call = ServerCall(Owner(), 1, [], received_ns=0, send_window=1 << 20,
                      receive_window=1 << 16, max_message_bytes=1 << 20, max_messages=8,
                      budget=budget)
    call.hold(300)
    assert budget.held_bytes == 300
    whole = b"\0" + (100).to_bytes(4, "big") + bytes(100)
    call.receive(whole)
    assert budget.held_bytes == 300 + 105
    assert call.receive(b"\0" + (1000).to_bytes(4, "big")) == 5  # credited as buffered
    assert call.assembling and budget.held_bytes == 300 + 105 + 5
    call.receive(bytes(1000))
    assert not call.assembling and budget.held_bytes == 300 + 105 + 1005
    assert call.next_message() == bytes(100)  # in use until the next read
    assert call.next_message() == bytes(1000)
    assert budget.held_bytes == 300 + 1005
    with pytest.raises(CallFailed, match="its limit is 1048576"):
        call.receive(b"\0" + (1 << 20).to_bytes(4, "big"))  # 1 MiB more could never be held
    call.release()
    assert budget.held_bytes == 0
