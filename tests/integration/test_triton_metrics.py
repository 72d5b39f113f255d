"""`serve --triton-metrics`: /metrics also carries Triton's names (nv_inference_*, nv_cache_*,
nv_cpu_*) with what tritonclient's requests did, so dashboards, alerts and autoscalers
written against Triton read a Serval node unchanged; without the flag there are none."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from serval.ports import free_ports
from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call
from tests.integration.test_triton_config import SIMPLE

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]


def _metrics(server: RunningServer) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = call(server.url, "GET", "/metrics").body.decode()
    return {(family.name if sample.name == f"{family.name}_total" else sample.name,
             frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _inputs(value: float, width: int = 16) -> list[httpclient.InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, width], "FP32")
        tensor.set_data_from_numpy(np.full((1, width), value, np.float32))
        inputs.append(tensor)
    return inputs


def test_triton_names_count_what_tritonclient_did(server_factory: Factory,
                                                  tmp_path: Path) -> None:
    fixture_models.add_sub(tmp_path, "simple")
    fixture_models.triton_config(tmp_path, "simple",
                                 SIMPLE + "response_cache { enable: true }\n")
    server = server_factory(tmp_path, "--triton-metrics", "--cache-config",
                            "local,size=1048576")
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    for _ in range(3):  # the first runs the model; the next two are answered by the cache
        client.infer("simple", _inputs(1.0))
    with pytest.raises(InferenceServerException):
        client.infer("simple", _inputs(1.0, width=15))  # a 400: Triton's reason OTHER
    metrics = _metrics(server)
    simple = frozenset({("model", "simple"), ("version", "1")})
    assert metrics[("nv_inference_request_success", simple)] == 3
    assert metrics[("nv_inference_request_failure", simple | {("reason", "OTHER")})] == 1
    assert metrics[("nv_inference_request_failure", simple | {("reason", "REJECTED")})] == 0
    assert metrics[("nv_inference_count", simple)] == 1
    assert metrics[("nv_inference_exec_count", simple)] == 1
    assert metrics[("nv_inference_pending_request_count", simple)] == 0
    assert metrics[("nv_inference_compute_infer_duration_us", simple)] > 0
    assert metrics[("nv_inference_request_duration_us", simple)] >= \
        metrics[("nv_inference_compute_infer_duration_us", simple)]
    assert metrics[("nv_cache_num_hits_per_model", simple)] == 2
    assert metrics[("nv_cache_num_misses_per_model", simple)] == 1
    assert 0.0 <= metrics[("nv_cpu_utilization", frozenset())] <= 1.0
    total = metrics[("nv_cpu_memory_total_bytes", frozenset())]
    assert 0 < metrics[("nv_cpu_memory_used_bytes", frozenset())] < total
    assert metrics[("serval_inferences", simple)] == 1  # Serval's own names stay (the parser
    # names a counter family without its _total)


def test_without_the_flag_there_are_no_triton_names(server: RunningServer) -> None:
    text = call(server.url, "GET", "/metrics").body.decode()
    assert "serval_requests_total" in text and "nv_" not in text


def test_the_metrics_port_serves_metrics_and_nothing_else(server_factory: Factory,
                                                          tmp_path: Path) -> None:
    """Triton's metrics port (--metrics-port, 8002 there): a Prometheus job scraping it
    carries over; the v2 API is not reachable through it."""
    fixture_models.add_sub(tmp_path)
    (port,) = free_ports(1)
    server = server_factory(tmp_path, "--metrics-port", str(port), "--triton-metrics")
    url = f"127.0.0.1:{port}"
    scraped = call(url, "GET", "/metrics")
    assert scraped.status == 200
    assert "serval_requests_total" in scraped.body.decode()
    assert "nv_inference_request_success" in scraped.body.decode()
    for method, path in (("GET", "/v2/health/ready"), ("GET", "/v2/models/add_sub"),
                         ("POST", "/v2/models/add_sub/infer"), ("GET", "/")):
        refused = call(url, method, path, b"{}" if method == "POST" else None)
        assert refused.status == 404, (path, refused.body)
        assert "serves GET /metrics only" in refused.error
    assert call(server.url, "GET", "/metrics").status == 200  # and on the HTTP port, as before

