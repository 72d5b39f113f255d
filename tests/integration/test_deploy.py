"""deploy/: every metric the Grafana dashboard queries is one a real server exports."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests import fixture_models
from tests.conftest import ROOT, RunningServer
from tests.integration.http_helpers import call, infer

pytestmark = pytest.mark.integration
DASHBOARD = ROOT / "deploy" / "grafana" / "serval-dashboard.json"
SCRAPE = ROOT / "deploy" / "prometheus" / "prometheus.yml"
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}


def _expressions() -> list[str]:
    dashboard = orjson.loads(DASHBOARD.read_bytes())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_dashboard_queries_only_metrics_the_server_exports(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    fixture_models.linear(tmp_path, config="max_batch_size: 32\nresponse_cache: true\n")
    server = server_factory(tmp_path, "--memory-budget", "64MiB",
                            "--cache-config", "local,size=1MB")
    for _ in range(2):  # a miss, then a hit: the response cache's series
        assert infer(server.url, "linear", X).status == 200
    exported = {sample.name for family in text_string_to_metric_families(
        call(server.url, "GET", "/metrics").body.decode()) for sample in family.samples}
    queried = {name for expr in _expressions()
               for name in re.findall(r"\b((?:serval|process)_[a-z_]+)\b", expr)}
    assert len(queried) >= 15
    assert queried - exported == set()


def test_the_dashboard_covers_what_an_operator_needs() -> None:
    dashboard = orjson.loads(DASHBOARD.read_bytes())
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"  # Grafana asks on import
    expressions = " ".join(_expressions())
    for needed in ("histogram_quantile(0.99, sum by (le) (rate(serval_request_duration_seconds",
                   "serval_queue_duration_seconds_bucket", "serval_compute_duration_seconds_bucket",
                   "serval_batch_size_bucket", "serval_model_evictions_total",
                   "serval_resident_bytes", "serval_memory_budget_bytes"):
        assert needed in expressions
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_the_scrape_example_targets_serval_metrics() -> None:
    config = yaml.safe_load(SCRAPE.read_text())
    job = config["scrape_configs"][0]
    assert job["job_name"] == "serval" and job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == ["localhost:8000"]
