"""The load test's first request: an answer is read within bounds, whatever the server sends."""

from __future__ import annotations

import socket
import threading

import pytest

from serval.loadtest.probe import MAX_ANSWER_BYTES, http_call
from serval.loadtest.workloads import WorkloadError

pytestmark = pytest.mark.unit


def test_an_endless_answer_is_cut_off_at_the_bound() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def endless() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
            chunk = b"\0" * 65536
            try:
                while not stop.is_set():
                    conn.sendall(chunk)
            except OSError:  # the client stopped reading and closed
                pass

    server = threading.Thread(target=endless, daemon=True)
    server.start()
    try:
        with pytest.raises(WorkloadError, match=f"runs past {MAX_ANSWER_BYTES} bytes"):
            http_call("127.0.0.1", port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 10.0)
    finally:
        stop.set()
        server.join(10)
        listener.close()
