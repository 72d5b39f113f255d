"""A client that opens a TLS connection and never finishes the handshake is dropped in time."""

from __future__ import annotations

import select
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from tests.integration.test_tls import _wait_https, start_tls_server
from tests.security.conftest import closed_within, connect

pytestmark = pytest.mark.integration


def test_a_stalled_tls_handshake_is_closed_on_both_ports(tmp_path: Path) -> None:
    server = start_tls_server(tmp_path, "--tls-handshake-timeout-s", "1")
    try:
        for target in (server.port, server.grpc_port):
            silent, partial = connect(target), connect(target)
            partial.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # ClientHello start
            started = time.monotonic()
            closed_within(silent, 5.0)
            closed_within(partial, 5.0)
            assert time.monotonic() - started < 4.0
            silent.close()
            partial.close()
        assert _wait_https(server.port, server.context) == 200  # and it goes on serving
    finally:
        server.process.terminate()
        server.process.wait(timeout=30)


def _closed_count(socks: list[socket.socket], at_least: int, within_s: float) -> int:
    """How many of socks the server closed, waiting until at_least are or within_s passed."""
    open_socks, closed = list(socks), 0
    deadline = time.monotonic() + within_s
    while closed < at_least and time.monotonic() < deadline:
        readable, _, _ = select.select(open_socks, [], [], 0.1)
        for sock in readable:
            try:
                chunk = sock.recv(1024)
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if not chunk:
                open_socks.remove(sock)
                closed += 1
    return closed


def test_connections_stuck_in_the_handshake_count_against_the_limit_and_make_room(
        tmp_path: Path) -> None:
    """Handshaking connections are gated too: 40 that never say hello, at a limit of 8, neither
    hold 40 descriptors until the timeout nor lock out good TLS clients on either port."""
    server = start_tls_server(tmp_path, "--max-connections", "8", "--tls-handshake-timeout-s",
                              "30")
    stalled: list = []
    try:
        for target in (server.port, server.grpc_port):
            stalled += [connect(target) for _ in range(20)]
        # the gate closes the oldest handshakes to make room for newer ones, long before 30 s
        # (which 32 depends on the order the two listeners accepted them in)
        assert _closed_count(stalled, at_least=32, within_s=10.0) >= 32
        assert _wait_https(server.port, server.context) == 200
        client = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}", ssl=True,
                                                   root_certificates=str(server.cert))
        x = triton_grpc.InferInput("x", [1, 8], "FP32")
        x.set_data_from_numpy(np.ones((1, 8), np.float32))
        assert client.infer("linear", [x], client_timeout=5.0).as_numpy(
            "probabilities").shape == (1, 4)
    finally:
        for sock in stalled:
            sock.close()
        server.process.terminate()
        server.process.wait(timeout=30)
