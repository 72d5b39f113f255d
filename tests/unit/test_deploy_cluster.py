"""deploy/k8s/cluster (Serval nodes behind HAProxy on Kubernetes) is valid and says one thing:
every object validates against the Kubernetes JSON schema of its kind (offline: the schemas ship
in kubernetes-validate), CRDs have their required fields, the proxies' haproxy.cfg is exactly
what `serval cluster proxy-config` generates for the arguments it records, those arguments agree
with the nodes, Services and autoscalers, and the autoscalers read a metric Serval exports."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml
from typer.testing import CliRunner

from serval.cli.cluster import app as cluster_app
from serval.cli.main import app as main_app
from serval.observability.metrics import (
    Exposition,
    ModelGauges,
    ModelSeries,
    RegistryGauges,
    RegistryMetricsCollector,
)
from serval.server.build import GRACEFUL_SHUTDOWN_S
from serval.stats import Histogram, ModelStats

pytestmark = pytest.mark.unit

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CLUSTER = DEPLOY / "k8s" / "cluster"
SOURCE = DEPLOY.parent / "src"
NAMESPACE = "serval"
# the oldest Kubernetes the manifests are for (autoscaling/v2, policy/v1 and the rest are GA
# there) and the newest whose schemas the installed kubernetes-validate ships
K8S_VERSIONS = ("1.28", kubernetes_validate.latest_version())
# kustomize's own files, and manifests that are not Kubernetes objects of the cluster's
KUSTOMIZE = "kustomization.yaml"
NOT_IN_A_KUSTOMIZATION = {"prometheus-adapter-rules.yaml"}  # merged into the adapter's config
GENERATED_BY = "serval.dev/generated-by"
CONFIG_SHA = "serval.dev/haproxy-cfg-sha256"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _manifests() -> list[Path]:
    return sorted(p for p in CLUSTER.rglob("*.yaml") if p.name != KUSTOMIZE)


def _objects() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in _manifests() for doc in _documents(path)]


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [doc for _, doc in _objects() if doc["kind"] == kind
             and (name is None or doc["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def _flags(args: list[str]) -> dict[str, str]:
    """`--name value` pairs of a command line (every flag these manifests use takes a value)."""
    flags = {}
    for index, word in enumerate(args):
        if word.startswith("--"):
            flags[word] = args[index + 1]
    return flags


def _bytes(quantity: str) -> int:
    """Kubernetes (4Gi) and Serval (3GiB) binary sizes."""
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)B?", quantity)
    assert match, quantity
    return int(match[1]) << (10 * ("KiMiGiTi".index(match[2]) // 2 + 1))


def _proxy_command() -> list[str]:
    config_map = _one("ConfigMap", "serval-proxy")
    return shlex.split(config_map["metadata"]["annotations"][GENERATED_BY])


def _proxy_flags() -> dict[str, str]:
    return _flags(_proxy_command())


def _config() -> str:
    return str(_one("ConfigMap", "serval-proxy")["data"]["haproxy.cfg"])


# --- every object is valid ----------------------------------------------------------------


def _check_scaled_object(doc: dict[str, Any]) -> None:
    """KEDA's ScaledObject (keda.sh/v1alpha1): the fields its CRD requires, and sane values."""
    spec = doc["spec"]
    target = spec["scaleTargetRef"]
    assert target["name"] and target.get("kind", "Deployment") in ("Deployment", "StatefulSet")
    assert 0 <= spec.get("minReplicaCount", 0) <= spec.get("maxReplicaCount", 100)
    assert spec["triggers"], "a ScaledObject needs at least one trigger"
    for trigger in spec["triggers"]:
        assert isinstance(trigger["type"], str) and isinstance(trigger["metadata"], dict)
        assert all(isinstance(v, str) for v in trigger["metadata"].values()), \
            "KEDA trigger metadata values are strings"
        assert trigger.get("metricType", "AverageValue") in (
            "AverageValue", "Value", "Utilization")
        if trigger["type"] == "prometheus":
            assert {"serverAddress", "query", "threshold"} <= trigger["metadata"].keys()
            float(trigger["metadata"]["threshold"])
    behavior = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {}).get("behavior")
    if behavior:  # KEDA hands it to the HPA it makes: validate it as the HPA's
        hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
               "metadata": {"name": "x"},
               "spec": {"scaleTargetRef": target, "maxReplicas": 1, "behavior": behavior}}
        kubernetes_validate.validate(hpa, K8S_VERSIONS[0], strict=True)


CUSTOM_RESOURCES = {("keda.sh/v1alpha1", "ScaledObject"): _check_scaled_object}


def _is_custom(doc: dict[str, Any]) -> bool:
    """A CRD's object: its API group has a domain that is not Kubernetes' own (core `v1`,
    `apps/v1`, `policy/v1`, `rbac.authorization.k8s.io/v1` are built in)."""
    group = doc["apiVersion"].rpartition("/")[0]
    return "." in group and not group.endswith(".k8s.io")


def test_every_manifest_parses_into_named_objects() -> None:
    assert len(_manifests()) >= 6
    for path in _manifests():
        documents = _documents(path)
        assert documents, f"{path.name} holds no object"
        for doc in documents:
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), path.name
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_builtin_object_validates_against_its_kubernetes_schema(version: str) -> None:
    checked, problems = 0, []
    standalone = DEPLOY / "k8s" / "serval.yaml"
    for path, doc in [*_objects(), *((standalone, d) for d in _documents(standalone))]:
        if _is_custom(doc):
            continue  # no built-in schema: test_every_custom_resource_has_its_required_fields
        try:  # strict: an unknown (misspelt) field fails too
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(p) for p in exc.absolute_path)
            problems.append(f"{path.name}: {doc['kind']}/{doc['metadata']['name']} at "
                            f"{where}: {exc.message}")
        checked += 1
    assert problems == []
    assert checked >= 10


def test_every_custom_resource_has_its_required_fields() -> None:
    custom = [(path, doc) for path, doc in _objects() if _is_custom(doc)]
    assert custom, "the KEDA ScaledObject is a custom resource"
    for path, doc in custom:
        check = CUSTOM_RESOURCES.get((doc["apiVersion"], doc["kind"]))
        assert check is not None, f"{path.name}: no check for {doc['apiVersion']} {doc['kind']}"
        check(doc)


def test_kustomizations_list_every_manifest_once_in_one_namespace() -> None:
    listed: list[Path] = []
    for kustomization in sorted(CLUSTER.rglob(KUSTOMIZE)):
        spec = yaml.safe_load(kustomization.read_text())
        assert spec["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
        assert spec["kind"] == "Kustomization"
        assert spec["namespace"] == NAMESPACE
        for resource in spec["resources"]:
            target = (kustomization.parent / resource).resolve()
            assert target.is_file() or (target / KUSTOMIZE).is_file(), resource
            if target.is_file():
                listed.append(target)
    assert sorted(listed) == sorted(set(listed)), "a manifest is listed twice"
    expected = {p.resolve() for p in _manifests() if p.name not in NOT_IN_A_KUSTOMIZATION}
    assert set(listed) == expected
    assert all(doc["metadata"].get("namespace", NAMESPACE) == NAMESPACE
               for path, doc in _objects() if path.name not in NOT_IN_A_KUSTOMIZATION)


def test_kustomize_builds_both_variants() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (it builds kustomizations offline)")
    kinds = {}
    for variant in (CLUSTER, CLUSTER / "keda"):
        result = subprocess.run([kubectl, "kustomize", str(variant)], capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        docs = [d for d in yaml.safe_load_all(result.stdout) if d]
        assert all(d["metadata"].get("namespace") == NAMESPACE for d in docs
                   if d["kind"] != "Namespace")
        kinds[variant.name] = {d["kind"] for d in docs}
    shared = {"Namespace", "PersistentVolumeClaim", "StatefulSet", "Service", "ConfigMap",
              "Deployment", "PodDisruptionBudget"}
    assert kinds["cluster"] == shared | {"HorizontalPodAutoscaler"}
    assert kinds["keda"] == shared | {"ScaledObject"}  # never two autoscalers on the nodes


# --- the proxies' configuration is generated, and agrees with the rest ----------------------


def test_proxy_config_is_what_serval_cluster_proxy_config_generates() -> None:
    command = _proxy_command()
    assert command[:3] == ["serval", "cluster", "proxy-config"]
    assert "--dns" in command and "--node" not in command
    result = CliRunner().invoke(cluster_app, command[2:])
    assert result.exit_code == 0, result.output
    assert _config() == result.output, (
        "base/haproxy-config.yaml drifted from the generator: run "
        "deploy/k8s/cluster/render-proxy-config.sh")


def test_render_script_reproduces_the_committed_files(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    if bash is None or shutil.which("sha256sum") is None:
        pytest.skip("bash and coreutils are needed to run render-proxy-config.sh")
    copy = tmp_path / "cluster"
    shutil.copytree(CLUSTER, copy)
    serval = tmp_path / "serval"  # this interpreter's serval, whatever is on PATH
    serval.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m serval "$@"\n')
    serval.chmod(0o755)
    env = {**os.environ, "SERVAL": str(serval),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE),
                                                       os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([bash, str(copy / "render-proxy-config.sh")], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in ("haproxy-config.yaml", "proxy.yaml"):
        assert (copy / "base" / name).read_text() == (CLUSTER / "base" / name).read_text(), name


def test_proxy_pods_roll_when_the_config_changes() -> None:
    pod = _one("Deployment", "serval-proxy")["spec"]["template"]
    assert pod["metadata"]["annotations"][CONFIG_SHA] == \
        hashlib.sha256(_config().encode()).hexdigest(), \
        "run deploy/k8s/cluster/render-proxy-config.sh"


def test_haproxy_accepts_the_config(tmp_path: Path) -> None:
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        pytest.skip("haproxy is not installed")
    config = tmp_path / "haproxy.cfg"
    config.write_text(_config())
    result = subprocess.run([haproxy, "-c", "-f", str(config)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_proxy_config_names_the_headless_service_and_the_nodes_ports() -> None:
    flags = _proxy_flags()
    service = _one("Service", "serval-node")
    nodes = _one("StatefulSet", "serval-node")
    assert flags["--dns"] == f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is False
    assert nodes["spec"]["serviceName"] == service["metadata"]["name"]
    labels = nodes["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert nodes["spec"]["selector"]["matchLabels"].items() <= labels.items()
    container = _container(nodes)
    serve = _flags(container["args"])
    ports = _ports(container)
    assert ports == {"http": int(flags["--node-http-port"]),
                     "grpc": int(flags["--node-grpc-port"]),
                     "agent": int(flags["--node-agent-port"])}
    assert (serve["--http-port"], serve["--grpc-port"], serve["--agent-port"]) == (
        flags["--node-http-port"], flags["--node-grpc-port"], flags["--node-agent-port"])
    service_ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert service_ports == ports


def _a_records_per_answer(config: str, name: str) -> int:
    """How many A records of `name` fit in the DNS answers the proxy accepts: HAProxy announces
    512 bytes (EDNS0) unless its resolvers set accepted_payload_size, and a truncated answer
    fails the whole resolution (checked with HAProxy 2.6 and a truncating DNS server: past
    this count, every server-template slot lost its address ~30 s later)."""
    size = re.search(r"^\s*accepted_payload_size (\d+)", config, re.MULTILINE)
    payload = int(size[1]) if size else 512
    question = sum(len(label) + 1 for label in name.split(".")) + 1 + 4
    header, opt, record = 12, 11, 16  # an A record: name pointer, type, class, TTL, length, IP
    return (payload - header - question - opt) // record


def test_a_records_per_answer_for_the_default_payload() -> None:
    assert _a_records_per_answer("resolvers dns\n", "serval-node.serval.svc.cluster.local") == 27
    assert _a_records_per_answer("    accepted_payload_size 8192\n", "a.b") > 500


def test_autoscalers_stay_within_what_the_proxies_can_address() -> None:
    flags = _proxy_flags()
    limit = min(int(flags["--slots"]), _a_records_per_answer(_config(), flags["--dns"]))
    hpa = _one("HorizontalPodAutoscaler", "serval-node")["spec"]
    keda = _one("ScaledObject", "serval-node")["spec"]
    for target in (hpa["scaleTargetRef"], keda["scaleTargetRef"]):
        assert (target["apiVersion"], target["kind"], target["name"]) == (
            "apps/v1", "StatefulSet", "serval-node")
    assert 2 <= hpa["minReplicas"] <= hpa["maxReplicas"] <= limit
    assert 2 <= keda["minReplicaCount"] <= keda["maxReplicaCount"] <= limit
    # the autoscaler owns the count: an apply must not reset it
    assert "replicas" not in _one("StatefulSet", "serval-node")["spec"]


def test_proxy_deployment_serves_the_generated_config() -> None:
    flags = _proxy_flags()
    proxy = _one("Deployment", "serval-proxy")
    pod = proxy["spec"]["template"]["spec"]
    container = _container(proxy)
    assert proxy["spec"]["replicas"] == 2
    assert container["image"] == "haproxy:2.6"
    assert _ports(container) == {"http": int(flags["--http-port"]),
                                 "grpc": int(flags["--grpc-port"]),
                                 "stats": int(flags["--stats-port"])}
    assert flags["--host"] == "0.0.0.0"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/usr/local/etc/haproxy"  # the image's -f path
    volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == "serval-proxy"
    assert volume["configMap"]["items"] == [{"key": "haproxy.cfg", "path": "haproxy.cfg"}]
    assert container["readinessProbe"]["httpGet"]["port"] == "stats"
    # one HAProxy thread per whole core it is given
    resources = container["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == flags["--proxy-threads"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    # the soft stop (SIGUSR1) may take hard-stop-after 60s after the preStop pause
    assert pod["terminationGracePeriodSeconds"] >= 60 + 5
    service = _one("Service", "serval-proxy")["spec"]
    assert service["selector"].items() <= proxy["spec"]["template"]["metadata"]["labels"].items()
    assert {p["name"]: p["port"] for p in service["ports"]} == {"http": 8000, "grpc": 8001}


# --- nodes ----------------------------------------------------------------------------------


def _serve_command() -> Any:
    """`serval serve` as the CLI parses it (typer's own click: no isinstance on click's)."""
    return getattr(typer.main.get_command(main_app), "commands")["serve"]  # noqa: B009


def test_nodes_run_serve_with_flags_it_accepts() -> None:
    nodes = _one("StatefulSet", "serval-node")
    container = _container(nodes)
    env = {e["name"]: e.get("value", "serval-node-0") for e in container["env"]}
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], a) for a in container["args"]]
    assert args[0] == "serve"
    context = _serve_command().make_context("serve", args[1:])  # raises on an unknown flag
    params = context.params
    assert params["model_control"] == "lazy"
    assert params["node_name"] == "serval-node-0"
    assert params["agent_port"] == int(_proxy_flags()["--node-agent-port"])
    assert params["drain_delay_s"] == 3
    assert params["poll_interval_s"] == 5
    assert params["host"] == "0.0.0.0"
    pod_name = next(e for e in container["env"] if e["name"] == "POD_NAME")
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # drain delay, then in-flight requests for up to GRACEFUL_SHUTDOWN_S, before SIGKILL
    grace = nodes["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > params["drain_delay_s"] + GRACEFUL_SHUTDOWN_S
    # the models' budget fits in the container's memory limit with room for the rest
    resources = container["resources"]
    budget = _bytes(params["memory_budget"])
    assert budget <= 0.8 * _bytes(resources["limits"]["memory"])
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert "cpu" in resources["requests"]


def test_nodes_are_probed_on_v2_health_and_run_unprivileged() -> None:
    pod = _one("StatefulSet", "serval-node")["spec"]["template"]
    container = _container(_one("StatefulSet", "serval-node"))
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"


def test_nodes_share_one_read_only_repository() -> None:
    pod = _one("StatefulSet", "serval-node")["spec"]["template"]["spec"]
    container = _container(_one("StatefulSet", "serval-node"))
    repository = _flags(container["args"])["--repository"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == repository)
    assert mount["readOnly"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    claim = volume["persistentVolumeClaim"]
    assert claim["readOnly"] is True
    pvc = _one("PersistentVolumeClaim", claim["claimName"])
    assert pvc["spec"]["accessModes"] == ["ReadOnlyMany"]


def test_disruption_budgets_keep_the_proxies_up_and_take_one_node_at_a_time() -> None:
    for name, key, value in (("serval-node", "maxUnavailable", 1),
                             ("serval-proxy", "minAvailable", 1)):
        pdb = _one("PodDisruptionBudget", name)["spec"]
        assert pdb[key] == value
        workload = _one("StatefulSet" if name == "serval-node" else "Deployment", name)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert pdb["selector"]["matchLabels"].items() <= labels.items()
    assert _one("PodDisruptionBudget", "serval-proxy")["spec"]["minAvailable"] < \
        _one("Deployment", "serval-proxy")["spec"]["replicas"]


# --- the autoscalers read a metric Serval exports -------------------------------------------


def _exported_metric_names() -> set[str]:
    """The metric names in Serval's /metrics, from its own collectors with one model."""
    totals = ModelStats("_all", "")
    model = ModelGauges(ModelStats("m", "1", totals), memory_bytes=1, ready=True,
                        pending_requests=3, running_batches=1)
    registry_gauges = RegistryGauges(loads=1, evictions=0, resident_bytes=1, budget_bytes=2,
                                     hits=1, misses=0, load_seconds=Histogram([1.0]))
    text = Exposition(ModelSeries(lambda: [model], totals, top_k=10),
                      RegistryMetricsCollector(lambda: registry_gauges)).render().decode()
    return {line.split("{")[0].split()[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def test_autoscaling_reads_serval_queue_depth() -> None:
    exported = _exported_metric_names()
    assert "serval_pending_requests" in exported
    adapter = _one("ConfigMap", "prometheus-adapter")
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    hpa_metrics = {m["pods"]["metric"]["name"]
                   for m in _one("HorizontalPodAutoscaler", "serval-node")["spec"]["metrics"]
                   if m["type"] == "Pods"}
    assert hpa_metrics
    for name in hpa_metrics:
        rule = next(r for r in rules if r["name"]["as"] == name)
        series = re.match(r"\w+", rule["seriesQuery"])
        assert series and series[0] in exported
        assert re.fullmatch(rule["name"]["matches"], series[0])
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
        assert "sum(" in rule["metricsQuery"]  # one value per pod: every model's queue
    queries = [t["metadata"]["query"]
               for t in _one("ScaledObject", "serval-node")["spec"]["triggers"]
               if t["type"] == "prometheus"]
    assert queries
    for query in queries:
        names = set(re.findall(r"\bserval_\w+", query))
        assert names and names <= exported, names - exported
        assert f'namespace="{NAMESPACE}"' in query
