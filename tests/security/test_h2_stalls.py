"""HTTP/2 requests that never finish cannot hold the server: a message announced but not sent
holds nothing, messages waiting for their stream's end count against the receive budget, a
request that stops arriving is cancelled after --body-timeout-s, and connections whose streams
stalled give their place to new clients."""

from __future__ import annotations

import struct
import time

import pytest

from serval.http2 import frames as h2
from tests.conftest import RunningServer
from tests.integration.http_helpers import infer
from tests.security.conftest import INFER_DOC, Factory, security_repository, watch
from tests.security.h2_helpers import RawH2, data, headers, message, request_block

pytestmark = pytest.mark.integration

CANCELLED, RESOURCE_EXHAUSTED = "1", "8"
BUDGET_MB = 32


@pytest.fixture(scope="module")
def stall_server(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory
                 ) -> RunningServer:
    return server_factory(security_repository(tmp_path_factory.mktemp("h2-stalls")),
                          "--receive-budget-mb", str(BUDGET_MB), "--body-timeout-s", "2",
                          "--h2-abuse-window-s", "0.5")


def _status(attacker: RawH2, stream_id: int, seconds: float) -> str | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status = attacker.read(0.05).statuses().get(stream_id)
        if status is not None:
            return status
    return None


def _messages(attacker: RawH2) -> list[str]:
    """Every grpc-message the server sent this connection."""
    from serval.http2.hpack import HpackDecoder
    decoder, found = HpackDecoder(), []
    for kind, _, _, payload in attacker.seen.frames:
        if kind == h2.HEADERS:
            found += [value for name, value in decoder.decode(payload) if name == "grpc-message"]
    return found


def test_a_message_announced_but_not_sent_holds_nothing(stall_server: RunningServer) -> None:
    """Three streams each announce a message nearly as large as the budget and send only its
    5-byte prefix: nothing is held for the rest, so every other request still gets in (before,
    each announcement reserved its whole length: the budget was gone, every body a 429)."""
    announced = struct.pack(">BL", 0, BUDGET_MB * 1024 * 1024 - 1024)
    with watch(stall_server) as result, RawH2(stall_server.grpc_port) as attacker:
        for stream_id in (1, 3, 5):
            attacker.send(headers(stream_id), data(stream_id, announced))
        assert _status(attacker, 5, 0.3) is None  # all three wait for the rest
        for _ in range(5):
            reply = infer(stall_server.url, "linear", INFER_DOC)
            assert reply.status == 200, reply.error
    result.assert_held()


def test_messages_waiting_for_their_streams_end_count_against_the_budget(
        stall_server: RunningServer) -> None:
    """Unary streams that send a whole 1 MiB message each and never end: what they hold is
    counted, so past the budget a stream is refused with RESOURCE_EXHAUSTED (before, whole
    messages were held uncounted: 16 MiB per connection, connections without limit)."""
    payload = message(bytes(1024 * 1024 - 64))
    attackers = [RawH2(stall_server.grpc_port) for _ in range(3)]
    statuses: list[str | None] = []
    try:
        for attacker in attackers:
            for stream_id in range(1, 31, 2):  # 15 MiB a connection: under its window
                attacker.send(headers(stream_id))  # each message in one DATA frame
                attacker.send_flow(stream_id, payload, 5.0, frame_bytes=len(payload))
        for attacker in attackers:
            statuses += [_status(attacker, sid, 0.05) for sid in range(1, 31, 2)]
        refused = statuses.count(RESOURCE_EXHAUSTED)
        assert refused >= 45 - BUDGET_MB, statuses
        assert set(statuses) <= {None, RESOURCE_EXHAUSTED}
    finally:
        for attacker in attackers:
            attacker.close()


@pytest.mark.parametrize("partial", [False, True])
def test_a_request_that_stops_arriving_is_cancelled(stall_server: RunningServer,
                                                    partial: bool) -> None:
    """A unary request whose end never comes, or a streaming call stopped part-way through a
    message, is ended with CANCELLED naming the flag after --body-timeout-s (2 s here)."""
    with RawH2(stall_server.grpc_port) as attacker:
        if partial:
            attacker.send(headers(1, request_block("ModelStreamInfer")),
                          data(1, message(bytes(1000))[:500]))
        else:
            attacker.send(headers(1))
        started = time.monotonic()
        assert _status(attacker, 1, 1.5) is None  # within the timeout it waits
        assert _status(attacker, 1, 10.0) == CANCELLED
        assert 2.0 <= time.monotonic() - started < 10.0
        assert any("nothing of it arrived for 2 s (--body-timeout-s)" in text
                   for text in _messages(attacker))
        assert attacker.seen.resets().get(1) == h2.NO_ERROR  # and told to stop sending


def test_a_quiet_stream_between_messages_is_not_stalled(stall_server: RunningServer) -> None:
    """A ModelStreamInfer call with no request in hand may stay quiet past the timeout."""
    with RawH2(stall_server.grpc_port) as attacker:
        attacker.send(headers(1, request_block("ModelStreamInfer")))
        assert _status(attacker, 1, 3.5) is None


def test_stalled_connections_give_their_place_to_new_clients(
        server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every connection slot held by an HTTP/2 connection whose one request stalled: a new
    client still gets in, as with HTTP/1.1 bodies that stall (before: 503 and UNAVAILABLE
    until the attacker let go)."""
    server = server_factory(security_repository(tmp_path_factory.mktemp("h2-slots")),
                            "--max-connections", "6")
    attackers = [RawH2(server.grpc_port) for _ in range(6)]
    try:
        for attacker in attackers:
            attacker.send(headers(1))
        time.sleep(1.2)  # past STALLED_REQUEST_S: what makes a stalled request evictable
        reply = infer(server.url, "linear", INFER_DOC)
        assert reply.status == 200, reply.error
        evicted = [a for a in attackers if a.read(0.2).goaway is not None or a.seen.closed]
        assert evicted
    finally:
        for attacker in attackers:
            attacker.close()
