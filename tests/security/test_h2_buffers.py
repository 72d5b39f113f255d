"""What the server buffers for one HTTP/2 client is bounded: partial messages by the receive
budget, unread messages per stream, and ModelStreamInfer's requests while answers go unread."""

from __future__ import annotations

import subprocess
import time

import pytest

from serval.http2 import frames as h2
from tests.conftest import RunningServer
from tests.integration.http_helpers import metric, wait_until_idle
from tests.security.conftest import Factory, security_repository, watch
from tests.security.h2_helpers import (
    RawH2,
    data,
    headers,
    infer_request,
    message,
    report,
    request_block,
    rounds,
    window_update,
)

pytestmark = pytest.mark.integration

BUDGET_MB = 64
RESOURCE_EXHAUSTED = "8"


@pytest.fixture(scope="module")
def h2_server(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    return server_factory(security_repository(tmp_path_factory.mktemp("h2-buffers")),
                          "--receive-budget-mb", str(BUDGET_MB))


def _status(attacker: RawH2, stream_id: int, seconds: float = 3.0) -> str | None:
    for _ in range(int(seconds / 0.05)):
        status = attacker.read(0.05).statuses().get(stream_id)
        if status is not None:
            return status
    return None


def test_partial_large_messages_meet_the_receive_budget(h2_server: RunningServer) -> None:
    """Three clients each announce a 30 MiB message and send 29 MiB of it: the budget (64 MiB)
    holds two; the third is refused with RESOURCE_EXHAUSTED before its bytes are kept."""
    size = 30 * 1024 * 1024
    partial = message(bytes(size))[:size - 1024 * 1024]
    attackers = [RawH2(h2_server.grpc_port) for _ in range(3)]
    refused_before = metric(h2_server.url, "serval_receive_budget_refusals_total")
    with watch(h2_server) as result:
        for attacker in attackers:
            attacker.send(headers(1))
            attacker.send_flow(1, partial, 10.0)
        statuses = [attacker.read(0.3).statuses().get(1) for attacker in attackers]
        assert statuses[:2] == [None, None]  # still waiting for the rest
        assert statuses[2] == RESOURCE_EXHAUSTED
        assert attackers[2].seen.resets().get(1) == h2.NO_ERROR  # told to stop sending
        # what an operator sees: the budget nearly full, one refusal
        assert metric(h2_server.url, "serval_receive_budget_held_bytes") >= 2 * len(partial)
        assert metric(h2_server.url, "serval_receive_budget_refusals_total") == refused_before + 1
    for attacker in attackers:
        attacker.close()
    report("partial messages vs budget", result)
    result.assert_held()
    with RawH2(h2_server.grpc_port) as after:  # the budget came back with the connections
        after.send(headers(1))
        after.send_flow(1, message(bytes(size)), 10.0, end_stream=True)
        assert _status(after, 1, 5.0) == "3"  # zeros: not a valid request, but it was read


def test_many_messages_on_one_unary_stream(h2_server: RunningServer) -> None:
    """1.2M messages on a unary stream: unread ones hold the window, and past 128 of them the
    stream is refused."""
    flood = message(infer_request()) * 1000
    with watch(h2_server) as result:
        for _ in rounds(2.0):
            with RawH2(h2_server.grpc_port) as attacker:
                attacker.send(headers(1))
                for _ in range(1200):
                    if not attacker.send_flow(1, flood, 0.5) or 1 in attacker.seen.statuses():
                        break
                assert _status(attacker, 1) == RESOURCE_EXHAUSTED
    report("1.2M messages, one unary stream", result)
    result.assert_held()


def test_stream_infer_flood_on_a_zero_window(h2_server: RunningServer) -> None:
    """3M tiny ModelStreamInfer requests on one stream whose answers the client never takes:
    at most 128 run, 128 wait, then the stream ends with RESOURCE_EXHAUSTED; the rest of the
    flood is dropped unparsed."""
    frame_bytes = 64 * 1024
    one = message(infer_request())
    packed = one * (frame_bytes // len(one))
    total = 3_000_000 * len(one)
    with watch(h2_server) as result, RawH2(h2_server.grpc_port,
                                           {h2.INITIAL_WINDOW_SIZE: 0}) as attacker:
        attacker.send(headers(1, request_block("ModelStreamInfer")))
        sent = 0
        while sent < total and not attacker.seen.closed:
            sent += attacker.send_flow(1, packed, 5.0, stream_window=1 not in
                                       attacker.seen.resets())
        assert sent >= total
        assert attacker.seen.statuses().get(1) == RESOURCE_EXHAUSTED
        assert not attacker.seen.closed
    report("ModelStreamInfer flood, zero window", result)
    result.assert_held()


def _unread_by_server(port: int) -> int:
    """Bytes waiting in the receive queue of the server's end of a connection (ss)."""
    lines = subprocess.run(["ss", "-tnH", "state", "established", f"sport = :{port}"],
                           capture_output=True, text=True, check=True).stdout.splitlines()
    return sum(int(line.split()[0]) for line in lines)


def _stays_unread(port: int, seconds: float) -> bool:
    """The server's end holds unread bytes throughout `seconds` (a reading server empties its
    receive queue within a few loop turns)."""
    time.sleep(0.2)
    for _ in range(int(seconds / 0.1)):
        if not _unread_by_server(port):
            return False
        time.sleep(0.1)
    return True


def test_a_client_that_never_reads_stops_being_read(h2_server: RunningServer) -> None:
    """Calls whose answers the client never reads (huge windows, a tiny socket buffer): once
    the answers fill the socket the server stops reading that connection (write backpressure)
    instead of taking more work and queueing its answers."""
    request = message(infer_request())
    paused_after = None
    with watch(h2_server) as result, RawH2(h2_server.grpc_port,
                                           {h2.INITIAL_WINDOW_SIZE: 2**31 - 1},
                                           receive_buffer=4096) as attacker:
        attacker.send(window_update(0, 2**31 - 1 - 65_535))
        for first in range(1, 200_001, 1200):  # 600 at a time: under MAX_CONCURRENT_STREAMS
            attacker.sock.settimeout(1.0)
            try:
                attacker.sock.sendall(b"".join(headers(sid) + data(sid, request, True)
                                               for sid in range(first, first + 1200, 2)))
            except TimeoutError:
                paused_after = first // 2  # our own send blocked: certainly not read
                break
            # the calls read so far are answered (on a loaded box the next 600 would otherwise
            # join them past MAX_CONCURRENT_STREAMS, and the server rightly closes)
            wait_until_idle(h2_server.url, "linear")
            if _stays_unread(h2_server.grpc_port, 1.0):
                paused_after = first // 2 + 600
                break
        assert paused_after is not None, "the server kept reading a client that never reads"
    report(f"client that never reads (reading paused after {paused_after} calls)", result)
    result.assert_held()
