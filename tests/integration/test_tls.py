"""HTTPS and gRPC over TLS with a certificate made for the test."""

from __future__ import annotations

import http.client
import os
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from serval.ports import free_ports
from tests import fixture_models

pytestmark = pytest.mark.integration


def _certificate(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@dataclass
class TlsServer:
    process: subprocess.Popen[bytes]
    port: int
    grpc_port: int
    cert: Path
    context: ssl.SSLContext  # trusts the server's certificate


def start_tls_server(tmp_path: Path, *extra: str) -> TlsServer:
    """`serval serve` with a fresh certificate, HTTPS and gRPC over TLS, answering once ready."""
    fixture_models.linear(tmp_path / "repo")
    cert, key = _certificate(tmp_path)
    port, grpc_port = free_ports(2)
    process = subprocess.Popen(
        [sys.executable, "-m", "serval", "serve", "--repository", str(tmp_path / "repo"),
         "--http-port", str(port), "--grpc-port", str(grpc_port), "--tls-cert", str(cert),
         "--tls-key", str(key), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    context = ssl.create_default_context(cafile=str(cert))
    try:
        _wait_https(port, context)
    except BaseException:
        process.kill()
        raise
    return TlsServer(process, port, grpc_port, cert, context)


def test_https_and_grpc_tls(tmp_path: Path) -> None:
    server = start_tls_server(tmp_path)
    process, port, grpc_port, cert = server.process, server.port, server.grpc_port, server.cert
    try:
        assert _wait_https(port, server.context) == 200
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain.request("GET", "/v2/health/ready")
            plain.getresponse()
        client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}", ssl=True,
                                                   root_certificates=str(cert))
        x = triton_grpc.InferInput("x", [1, 8], "FP32")
        x.set_data_from_numpy(np.ones((1, 8), np.float32))
        assert client.infer("linear", [x]).as_numpy("probabilities").shape == (1, 4)
    finally:
        process.terminate()
        process.wait(timeout=30)


def _wait_https(port: int, context: ssl.SSLContext) -> int:
    deadline = time.monotonic() + 60
    while True:
        try:
            connection = http.client.HTTPSConnection("127.0.0.1", port, context=context,
                                                     timeout=2)
            connection.request("GET", "/v2/health/ready")
            return connection.getresponse().status
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
