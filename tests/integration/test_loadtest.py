"""The closed-loop load generator against a real server: counts, latencies, errors, its end."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from serval.loadtest.closed_loop import run_closed_loop
from serval.loadtest.http_client import encode_http_request
from tests import fixture_models
from tests.conftest import RunningServer, free_port
from tests.integration.http_helpers import call

pytestmark = pytest.mark.integration


def _linear_request(model: str = "linear", value: float = 0.25) -> bytes:
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8],
                                     "data": [value] * 8}]})
    return encode_http_request("POST", f"/v2/models/{model}/infer", body,
                               {"Content-Type": "application/json"}, "127.0.0.1")


@pytest.mark.parametrize("processes", [1, 2])
def test_closed_loop_measures_a_real_server(server: RunningServer, processes: int) -> None:
    result = run_closed_loop("127.0.0.1", server.port, [_linear_request()], concurrency=4,
                             duration_s=0.5, warmup_s=0.2, processes=processes)
    assert result.requests > 10 and result.errors == {}
    assert 0 < result.p50_ms <= result.p99_ms <= result.p999_ms
    # each request counts by the share of its lifetime inside the 0.5 s window
    assert result.throughput_rps == pytest.approx(result.requests / 0.5, rel=0.05)
    assert b'"probabilities"' in result.sample_body


def test_error_statuses_are_counted_by_code(server: RunningServer) -> None:
    result = run_closed_loop("127.0.0.1", server.port, [_linear_request("missing")],
                             concurrency=2, duration_s=0.3, warmup_s=0.1)
    assert result.requests == 0
    assert result.errors.get("http_404", 0) > 0


def test_refused_connections_are_counted_and_the_run_ends() -> None:
    result = run_closed_loop("127.0.0.1", free_port(), [_linear_request()], concurrency=2,
                             duration_s=0.3, warmup_s=0.0)
    assert result.requests == 0 and result.errors.get("connection", 0) > 0


def _always_429(port_holder: list[int], stop: threading.Event) -> None:
    """A server answering every request on every connection 429, Retry-After: 1."""
    reply = (b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 1\r\ncontent-length: 0\r\n\r\n")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    port_holder.append(listener.getsockname()[1])

    def serve(conn: socket.socket) -> None:
        conn.settimeout(0.1)
        with conn:
            while not stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                conn.sendall(reply * data.count(b"HTTP/1.1\r\n"))

    with listener:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()


@pytest.mark.parametrize("polite", [False, True])
def test_a_polite_client_waits_retry_after_a_storm_does_not(polite: bool) -> None:
    port: list[int] = []
    stop = threading.Event()
    server = threading.Thread(target=_always_429, args=(port, stop), daemon=True)
    server.start()
    while not port:
        time.sleep(0.01)
    try:
        result = run_closed_loop("127.0.0.1", port[0], [_linear_request()], concurrency=2,
                                 duration_s=1.5, warmup_s=0.0, honour_retry_after=polite)
    finally:
        stop.set()
        server.join(timeout=5)
    refused = result.errors.get("http_429", 0)
    if polite:
        assert 2 <= refused <= 2 * 2  # each client: at once, then after 1 s
    else:
        assert refused > 50


@pytest.mark.parametrize("processes", [1, 2])
def test_the_clients_share_out_the_request_list(
        server_factory: Callable[..., RunningServer], tmp_path: Path, processes: int) -> None:
    """Client i sends requests i, i + C, ...: no request goes out twice before the list runs
    out. The server's response cache counts it: every request a miss, none a hit."""
    fixture_models.linear(tmp_path, config="max_batch_size: 32\nresponse_cache: true\n")
    server = server_factory(tmp_path, "--cache-config", "local,size=64MB")
    requests = [_linear_request(value=index) for index in range(20_000)]
    result = run_closed_loop("127.0.0.1", server.port, requests, concurrency=8,
                             duration_s=0.5, warmup_s=0.1, processes=processes)
    stats = orjson.loads(call(server.url, "GET", "/v2/models/linear/stats").body)
    inference = stats["model_stats"][0]["inference_stats"]
    assert result.requests > 10 and inference["cache_miss"]["count"] < len(requests)
    assert inference["cache_hit"]["count"] == 0
