"""The closed-loop load generator against a real server: counts, latencies, errors, its end."""

from __future__ import annotations

import orjson
import pytest

from serval.loadtest.closed_loop import encode_http_request, run_closed_loop
from tests.conftest import RunningServer, free_port

pytestmark = pytest.mark.integration


def _linear_request(model: str = "linear") -> bytes:
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8],
                                     "data": [0.25] * 8}]})
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
