"""RFC 9113 violations end with the right stream or connection error; a request that is not
gRPC gets HTTP 415; the preface and idle timeouts close silent connections."""

from __future__ import annotations

import pytest

from serval.http2 import frames as h2
from serval.http2.hpack import HpackDecoder
from tests.conftest import RunningServer
from tests.security.conftest import Factory, security_repository, watch
from tests.security.h2_helpers import (
    RawH2,
    data,
    headers,
    infer_request,
    message,
    request_block,
    window_update,
)

pytestmark = pytest.mark.integration

PREFACE_S, IDLE_S = 1.0, 1.5


@pytest.fixture(scope="module")
def h2_server(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    return server_factory(security_repository(tmp_path_factory.mktemp("h2-protocol")),
                          "--h2-preface-timeout-s", str(PREFACE_S),
                          "--h2-idle-timeout-s", str(IDLE_S))


def _settings(payload: bytes, stream_id: int = 0) -> bytes:
    return h2.frame(h2.SETTINGS, 0, stream_id, payload)


_OPEN = headers(1)  # an open ModelInfer stream (no END_STREAM)
# name -> (frames after the client's SETTINGS, GOAWAY code)
CONNECTION_ERRORS: dict[str, tuple[bytes, int]] = {
    "window update 0 on the connection": (window_update(0, 0), h2.PROTOCOL_ERROR),
    "connection window overflow": (window_update(0, 2**31 - 1), h2.FLOW_CONTROL_ERROR),
    "max frame size 0": (h2.settings_frame({h2.MAX_FRAME_SIZE: 0}), h2.PROTOCOL_ERROR),
    "max frame size 2^24": (h2.settings_frame({h2.MAX_FRAME_SIZE: 2**24}), h2.PROTOCOL_ERROR),
    "enable push 2": (h2.settings_frame({h2.ENABLE_PUSH: 2}), h2.PROTOCOL_ERROR),
    "initial window 2^31": (h2.settings_frame({h2.INITIAL_WINDOW_SIZE: 2**31}),
                            h2.FLOW_CONTROL_ERROR),
    "settings of 5 bytes": (_settings(b"\x00" * 5), h2.FRAME_SIZE_ERROR),
    "settings on a stream": (_settings(b"", 1), h2.PROTOCOL_ERROR),
    "settings ack with payload": (h2.frame(h2.SETTINGS, h2.ACK, 0, b"\x00" * 6),
                                  h2.FRAME_SIZE_ERROR),
    "decreasing stream ids": (headers(5) + headers(3), h2.PROTOCOL_ERROR),
    "even stream id": (headers(2), h2.PROTOCOL_ERROR),
    "ping of 7 bytes": (h2.frame(h2.PING, 0, 0, b"\x00" * 7), h2.FRAME_SIZE_ERROR),
    "ping on a stream": (h2.frame(h2.PING, 0, 1, b"\x00" * 8), h2.PROTOCOL_ERROR),
    "rst_stream on stream 0": (h2.rst_stream(0, h2.CANCEL), h2.PROTOCOL_ERROR),
    "rst_stream on an idle stream": (h2.rst_stream(9, h2.CANCEL), h2.PROTOCOL_ERROR),
    "data on an idle stream": (data(7, b"x"), h2.PROTOCOL_ERROR),
    "data on stream 0": (data(0, b"x"), h2.PROTOCOL_ERROR),
    "data beyond the connection window": (
        b"".join(headers(sid) + data(sid, message(bytes(900_000))) for sid in range(1, 41, 2)),
        h2.FLOW_CONTROL_ERROR),
    "window update of 3 bytes": (h2.frame(h2.WINDOW_UPDATE, 0, 0, b"\x00" * 3),
                                 h2.FRAME_SIZE_ERROR),
    "push promise": (h2.frame(h2.PUSH_PROMISE, h2.END_HEADERS, 1, b"\x00" * 4),
                     h2.PROTOCOL_ERROR),
    "continuation without headers": (h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, b""),
                                     h2.PROTOCOL_ERROR),
    "interleaved header block": (h2.frame(h2.HEADERS, 0, 1, request_block()) + h2.frame(
        h2.PING, 0, 0, b"\x00" * 8), h2.PROTOCOL_ERROR),
    "goaway on a stream": (h2.frame(h2.GOAWAY, 0, 1, b"\x00" * 8), h2.PROTOCOL_ERROR),
}


@pytest.mark.parametrize("case", sorted(CONNECTION_ERRORS))
def test_connection_errors_end_with_goaway(h2_server: RunningServer, case: str) -> None:
    frames, code = CONNECTION_ERRORS[case]
    with watch(h2_server) as result, RawH2(h2_server.grpc_port) as attacker:
        attacker.send(frames)
        assert attacker.closed_with(2.0) == code
    result.assert_held()


def test_a_first_frame_other_than_settings_is_a_protocol_error(h2_server: RunningServer) -> None:
    with RawH2(h2_server.grpc_port, preface=False) as attacker:
        attacker.send(h2.PREFACE + h2.frame(h2.PING, 0, 0, b"\x00" * 8))
        assert attacker.closed_with(2.0) == h2.PROTOCOL_ERROR


# name -> (frames on open stream 1, RST_STREAM code)
STREAM_ERRORS: dict[str, tuple[bytes, int]] = {
    "window update 0 on a stream": (window_update(1, 0), h2.PROTOCOL_ERROR),
    "stream window overflow": (window_update(1, 2**31 - 1) * 2, h2.FLOW_CONTROL_ERROR),
    "data beyond the stream window": (data(1, message(bytes(700_000))) * 2,
                                      h2.FLOW_CONTROL_ERROR),
    "data after end of stream": (data(1, message(infer_request())[:3]) + data(1, b"", True)
                                 + data(1, b"x"), h2.STREAM_CLOSED),
}


@pytest.mark.parametrize("case", sorted(STREAM_ERRORS))
def test_stream_errors_reset_only_the_stream(h2_server: RunningServer, case: str) -> None:
    frames, code = STREAM_ERRORS[case]
    with RawH2(h2_server.grpc_port, {h2.INITIAL_WINDOW_SIZE: 0}) as attacker:
        attacker.send(_OPEN + frames)
        for _ in range(20):
            if 1 in attacker.read(0.1).resets():
                break
        assert attacker.seen.resets()[1] == code
        attacker.send(headers(3, end_stream=False) + data(3, message(infer_request()), True),
                      window_update(0, 1 << 20), h2.settings_frame({h2.INITIAL_WINDOW_SIZE: 65535}))
        for _ in range(50):  # the connection still serves
            if attacker.read(0.1).statuses().get(3) == "0":
                break
        assert attacker.seen.statuses().get(3) == "0" and not attacker.seen.closed


def test_a_request_that_is_not_grpc_gets_415(h2_server: RunningServer) -> None:
    with watch(h2_server) as result, RawH2(h2_server.grpc_port) as client:
        client.send(headers(1, request_block(content_type="text/plain"), end_stream=True))
        for _ in range(20):
            if 1 in client.read(0.1).statuses():
                break
        assert client.seen.statuses()[1] == "415"
    result.assert_held()


def test_a_header_list_over_the_limit_fails_its_stream_only(h2_server: RunningServer) -> None:
    """RFC 9113 10.5.1: the block is processed (the HPACK table stays in step), the stream gets
    RESOURCE_EXHAUSTED naming the limit, and the connection serves the next call."""
    big = request_block(extra=(("x-metadata", "v" * 70_000),))  # > the 64 KiB default
    with watch(h2_server) as result, RawH2(h2_server.grpc_port) as client:
        client.send(h2.frame(h2.HEADERS, 0, 1, big[:16_000])
                    + h2.frame(h2.CONTINUATION, 0, 1, big[16_000:32_000])
                    + h2.frame(h2.CONTINUATION, h2.END_HEADERS, 1, big[32_000:])
                    + data(1, message(infer_request()), True))
        client.send(headers(3) + data(3, message(infer_request()), True))
        for _ in range(50):
            if {1, 3} <= client.read(0.1).statuses().keys():
                break
        assert client.seen.statuses() == {1: "8", 3: "0"} and not client.seen.closed
        messages = [value for kind, _, sid, payload in client.seen.frames
                    if kind == h2.HEADERS and sid == 1
                    for name, value in HpackDecoder().decode(payload) if name == "grpc-message"]
        assert messages and "--h2-max-header-list-bytes" in messages[0]
    result.assert_held()


@pytest.mark.parametrize("sent", [b"", h2.PREFACE[:10], h2.PREFACE])
def test_a_client_without_preface_and_settings_is_closed(h2_server: RunningServer,
                                                         sent: bytes) -> None:
    with watch(h2_server) as result, RawH2(h2_server.grpc_port, preface=False) as slow:
        slow.send(sent)
        slow.closed_with(PREFACE_S + 1.5)
    result.assert_held()


def test_an_idle_connection_gets_goaway(h2_server: RunningServer) -> None:
    with watch(h2_server) as result, RawH2(h2_server.grpc_port) as idle:
        idle.send(headers(1, end_stream=True))  # one call, answered; then nothing
        assert idle.closed_with(IDLE_S + 3.5) == h2.NO_ERROR
        assert idle.seen.statuses()[1] == "3"  # INVALID_ARGUMENT: no request message
    result.assert_held()

