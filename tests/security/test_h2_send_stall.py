"""An HTTP/2 client that takes none of its answers (it grants no window, or never reads the
socket) is closed after --h2-send-timeout-s; one that takes them slowly is not."""

from __future__ import annotations

import time

import pytest

from serval.http2 import frames as h2
from tests.conftest import RunningServer
from tests.security.conftest import Factory, security_repository, watch
from tests.security.h2_helpers import RawH2, data, headers, infer_request, message, window_update

pytestmark = pytest.mark.integration

SEND_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def h2_server(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    return server_factory(security_repository(tmp_path_factory.mktemp("h2-stall")),
                          "--h2-send-timeout-s", str(SEND_TIMEOUT_S))


def test_a_client_that_grants_no_window_is_closed(h2_server: RunningServer) -> None:
    with watch(h2_server) as result, RawH2(h2_server.grpc_port,
                                           {h2.INITIAL_WINDOW_SIZE: 0}) as stalled:
        stalled.send(headers(1) + data(1, message(infer_request()), True))
        started = time.monotonic()
        stalled.closed_with(SEND_TIMEOUT_S + 12.0)
        waited = time.monotonic() - started
        assert SEND_TIMEOUT_S * 0.9 <= waited <= SEND_TIMEOUT_S + 3.0
        assert not stalled.seen.of(h2.DATA)  # it never had room for its answer
    result.assert_held()


def test_a_client_that_never_reads_is_closed(h2_server: RunningServer) -> None:
    request = message(infer_request())
    with watch(h2_server) as result, RawH2(h2_server.grpc_port, {h2.INITIAL_WINDOW_SIZE: 2**31 - 1},
                                           receive_buffer=4096) as stalled:
        stalled.send(window_update(0, 2**31 - 1 - 65_535))
        for first in range(1, 20_001, 200):  # answers pile up in the socket until it is full
            if not stalled.send(b"".join(headers(sid) + data(sid, request, True)
                                         for sid in range(first, first + 200, 2))):
                break
        stalled.closed_with(SEND_TIMEOUT_S + 12.0)
    result.assert_held()


def test_a_client_that_grants_window_slowly_is_served(h2_server: RunningServer) -> None:
    """Progress, however slow, restarts the clock: 1 KiB of window every 0.4 s for 3 s."""
    with RawH2(h2_server.grpc_port, {h2.INITIAL_WINDOW_SIZE: 0}) as slow:
        slow.send(headers(1) + data(1, message(infer_request()), True))
        deadline = time.monotonic() + 3 * SEND_TIMEOUT_S
        while time.monotonic() < deadline:
            slow.send(window_update(1, 8))
            slow.read(0.4)
            assert not slow.seen.closed
        slow.send(window_update(1, 1 << 20))
        for _ in range(50):
            if 1 in slow.read(0.1).statuses():
                break
        assert slow.seen.statuses().get(1) == "0" and not slow.seen.closed
