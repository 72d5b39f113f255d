"""A client that opens a TLS connection and never finishes the handshake is dropped in time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

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
