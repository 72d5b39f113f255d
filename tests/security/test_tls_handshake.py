"""A client that opens a TLS connection and never finishes the handshake is dropped in time."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import fixture_models
from tests.conftest import free_port
from tests.integration.test_tls import _certificate, _wait_https
from tests.security.conftest import closed_within, connect

pytestmark = pytest.mark.integration


def test_a_stalled_tls_handshake_is_closed_on_both_ports(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path / "repo")
    cert, key = _certificate(tmp_path)
    port, grpc_port = free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "serval", "serve", "--repository", str(tmp_path / "repo"),
         "--http-port", str(port), "--grpc-port", str(grpc_port), "--tls-cert", str(cert),
         "--tls-key", str(key), "--tls-handshake-timeout-s", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        context = ssl.create_default_context(cafile=str(cert))
        assert _wait_https(port, context) == 200
        for target in (port, grpc_port):
            silent, partial = connect(target), connect(target)
            partial.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # ClientHello start
            started = time.monotonic()
            closed_within(silent, 5.0)
            closed_within(partial, 5.0)
            assert time.monotonic() - started < 4.0
            silent.close()
            partial.close()
        assert _wait_https(port, context) == 200  # and the server goes on serving
    finally:
        process.terminate()
        process.wait(timeout=30)
