"""Serval on Ray Serve against standalone Serval, on this machine, in one run.

1. `lstm` at 64 clients (binary tensors, one row each): standalone `serval serve` vs the same
   data plane behind Ray Serve's proxy and the Serval ingress (one replica with the same 2 CPUs);
   at 1 client too, so the ingress hop's cost is stated as added latency and CPU per request.
2. 1,000 small models over 2 replicas whose byte budgets hold ~60% of them each, Zipf(1.1)
   traffic at 64 clients: errors (goal: none), and where each model is resident at the end
   (goal: on at most 2 replicas; how many are on both is reported too).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/cluster.py
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import orjson
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers, workloads
from serval.backends.onnxruntime import SESSION_OVERHEAD_BYTES
from serval.loadtest.closed_loop import run_closed_loop
from serval.loadtest.http_client import encode_http_request
from serval.loadtest.stats import StepResult

GOAL_RATIO = 0.5
IN, HIDDEN, OUT = 64, 64, 8
OBJECT_STORE_BYTES = 100 * 1024 * 1024
_BODY = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, IN],
                                  "data": [0.1] * IN}]})


def main() -> None:
    args = _parse_args()
    lstm_repo = Path(tempfile.mkdtemp(prefix="serval-cluster-lstm-"))
    (lstm_repo / "lstm").symlink_to(args.repository.resolve() / "lstm")
    requests = workloads.infer_requests(
        "lstm", workloads.random_feeds(workloads.model_spec(
            workloads.model_file(args.repository, "lstm")), 1, 64), True, servers.HOST)
    standalone = {} if args.many_only else _standalone(lstm_repo, requests, args)
    port = servers.free_port()
    paths: dict[str, dict[int, StepResult]] = {}
    with _ray(num_cpus=2, port=port):
        if not args.many_only:
            paths["ray proxy + ingress"] = _through_ray(port, lstm_repo, requests, args, True)
            paths["ray proxy -> replica"] = _through_ray(port, lstm_repo, requests, args, False)
        placement = _many_models(port, args)
    _report(standalone, paths, placement, args)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--many-only", action="store_true", help="skip the lstm comparison")
    parser.add_argument("--share", type=float, default=0.6,
                        help="fraction of the models one replica's budget holds")
    return parser.parse_args()


# --- 1. lstm: standalone vs through Ray ------------------------------------------------------

def _standalone(repo: Path, requests: list[bytes], args: argparse.Namespace
                ) -> dict[int, StepResult]:
    port = servers.free_port()
    command = servers.serval_command(repo, port, 1, 0)
    with servers.running(command, port, "/v2/health/ready", repo.parent / "standalone.log"):
        return _levels(port, requests, args)


def _levels(port: int, requests: list[bytes], args: argparse.Namespace
            ) -> dict[int, StepResult]:
    run_closed_loop(servers.HOST, port, requests, args.clients, 3.0, 1.0)  # warm the path
    return {clients: run_closed_loop(servers.HOST, port, requests, clients, args.duration, 2.0)
            for clients in (1, args.clients)}


def _through_ray(port: int, repo: Path, requests: list[bytes], args: argparse.Namespace,
                 ingress: bool) -> dict[int, StepResult]:
    from ray import serve

    from serval.cluster.ray import build_app

    serve.run(build_app({"repository": str(repo), "num_replicas": 1, "replica_cpus": 2,
                         "max_ongoing_requests": 256, "poll_interval_s": 0,
                         "ingress": ingress}),
              name="serval", route_prefix="/")
    try:
        return _levels(port, requests, args)
    finally:
        serve.delete("serval")


# --- 2. 1,000 models over 2 replicas ---------------------------------------------------------

def _many_models(port: int, args: argparse.Namespace) -> dict[str, Any]:
    from ray import serve

    from serval.cluster.ray import build_app

    repo = Path(tempfile.mkdtemp(prefix="serval-cluster-many-"))
    names = _generate(repo, args.models)
    # what the registry charges a model: its file plus ONNX Runtime's session overhead
    model_bytes = (repo / names[0] / "1" / "model.onnx").stat().st_size + SESSION_OVERHEAD_BYTES
    budget = int(args.share * args.models * model_bytes)
    serve.run(build_app({"repository": str(repo), "num_replicas": 2, "replica_cpus": 1,
                         "memory_budget": budget, "poll_interval_s": 0,
                         "max_ongoing_requests": 256}),
              name="many", route_prefix="/")
    try:
        swept, sweep_errors = _every_model_once(port, names)
        zipf = _zipf_requests(names, 1.1, 20_000)
        started = time.perf_counter()
        traffic = run_closed_loop(servers.HOST, port, zipf, args.clients, args.duration * 2, 3.0)
        elapsed_s = time.perf_counter() - started
        replicas = _residency(serve.get_deployment_handle("ServalReplica", app_name="many"))
    finally:
        serve.delete("many")
    holders: dict[str, int] = {}
    for report in replicas.values():
        for name in report["models"]:
            holders[name] = holders.get(name, 0) + 1
    return {"traffic": traffic, "elapsed_s": elapsed_s, "replicas": replicas,
            "swept": swept, "sweep_errors": sweep_errors,
            "holders": holders, "budget_bytes": budget, "model_bytes": model_bytes,
            "models": len(names)}


def _every_model_once(port: int, names: list[str]) -> tuple[int, list[str]]:
    """One request per model, 16 at a time: every model gets placed somewhere."""
    def one(name: str) -> str:
        connection = http.client.HTTPConnection(servers.HOST, port, timeout=120)
        try:
            connection.request("POST", f"/v2/models/{name}/infer", body=_BODY,
                               headers={"Content-Type": "application/json"})
            reply = connection.getresponse()
            data = reply.read()
            return "" if reply.status == 200 else f"{name}: {reply.status} {data[:200]!r}"
        except OSError as exc:
            return f"{name}: {exc}"
        finally:
            connection.close()

    with ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(one, names))
    return len(names), [o for o in outcomes if o]


def _residency(handle: Any) -> dict[str, dict[str, Any]]:
    """Each replica's resident() report (calls until both replicas have answered)."""
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(200):
        report = handle.resident.remote().result()
        seen[report["replica"]] = report
        if len(seen) == 2:
            break
    return seen


def _generate(repo: Path, count: int) -> list[str]:
    """`count` small MLP heads (64 -> 64 -> 8) with distinct weights."""
    names = []
    for index in range(count):
        rng = np.random.default_rng(index)
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["a"]),
             helper.make_node("MatMul", ["a", "W2"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1)],
            "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN])],
            [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", OUT])],
            initializer=[_weights(rng, (IN, HIDDEN), "W1"), _weights(rng, (HIDDEN, OUT), "W2")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        name = f"head{index:04d}"
        (repo / name / "1").mkdir(parents=True)
        onnx.save(model, str(repo / name / "1" / "model.onnx"))
        names.append(name)
    return names


def _weights(rng: np.random.Generator, shape: tuple[int, int], name: str) -> onnx.TensorProto:
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def _zipf_requests(names: list[str], exponent: float, count: int) -> list[bytes]:
    ranks = np.arange(1, len(names) + 1, dtype=np.float64)
    weights = ranks ** -exponent
    picks = np.random.default_rng(7).choice(len(names), size=count, p=weights / weights.sum())
    return [encode_http_request("POST", f"/v2/models/{names[i]}/infer", _BODY,
                                {"Content-Type": "application/json"}, servers.HOST)
            for i in picks]


# --- Ray and the report ----------------------------------------------------------------------

@contextlib.contextmanager
def _ray(num_cpus: int, port: int) -> Iterator[None]:
    """A local single-node Ray with `num_cpus` (the same 2 cores), Serve's HTTP on `port`;
    always shut down."""
    import ray
    from ray import serve

    ray.init(num_cpus=num_cpus, object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False,
             logging_level="WARNING", log_to_driver=False)
    try:
        serve.start(http_options={"host": servers.HOST, "port": port})
        yield
    finally:
        serve.shutdown()
        ray.shutdown()


def _report(standalone: dict[int, StepResult], paths: dict[str, dict[int, StepResult]],
            placement: dict[str, Any], args: argparse.Namespace) -> None:
    print("\n== lstm, one row per request, binary tensors, 2 cores ==")
    print(f"{'path':<26}{'clients':>8}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}")
    if not standalone:
        paths = {}
    for label, results in (("standalone serval", standalone), *paths.items()):
        for clients, step in results.items():
            print(f"{label:<26}{clients:>8}{step.throughput_rps:>10,.0f}{step.p50_ms:>9.2f}"
                  f"{step.p99_ms:>9.2f}{step.failed:>8}")
    heavy, light = args.clients, 1
    for label, through_ray in paths.items():
        ratio = through_ray[heavy].throughput_rps / max(1e-9, standalone[heavy].throughput_rps)
        hop_ms = through_ray[light].p50_ms - standalone[light].p50_ms
        cpu_ms = 2 * 1000 * (1 / max(1e-9, through_ray[heavy].throughput_rps)
                             - 1 / max(1e-9, standalone[heavy].throughput_rps))
        print(f"{label}: +{hop_ms:.2f} ms p50 at 1 client; ~{cpu_ms:.2f} ms of CPU per "
              f"request at {heavy} clients (2 cores x the difference in time per request)")
        print(f"{'PASS' if ratio >= GOAL_RATIO else 'MISS'}: {label} {ratio:.0%} of standalone "
              f"throughput at {heavy} clients (goal >= {GOAL_RATIO:.0%})")

    traffic: StepResult = placement["traffic"]
    holders: dict[str, int] = placement["holders"]
    replicas = placement["replicas"]
    print(f"\n== {placement['models']:,} models over 2 replicas, budget "
          f"{placement['budget_bytes'] / 2**20:.1f} MiB each (~{args.share:.0%} of "
          f"{placement['models']:,} x {placement['model_bytes'] / 1024:.1f} KiB) ==")
    print(f"every model once (16 at a time): {placement['swept']:,} requests, "
          f"{len(placement['sweep_errors'])} errors {placement['sweep_errors'][:3]}")
    print(f"Zipf(1.1) @{args.clients}: {traffic.throughput_rps:,.0f} req/s, p50 "
          f"{traffic.p50_ms:.2f} ms, p99 {traffic.p99_ms:.2f} ms, errors {traffic.errors or 0}")
    for replica, report in replicas.items():
        print(f"replica {replica}: {len(report['models']):,} resident, "
              f"{report['resident_bytes'] / 2**20:.1f} MiB, loads {report['loads']:,}, "
              f"evictions {report['evictions']:,}")
    both = sum(1 for n in holders.values() if n == 2)
    print(f"resident somewhere: {len(holders):,} models; on both replicas: {both:,} "
          f"({both / max(1, len(holders)):.0%}); most copies of one model: "
          f"{max(holders.values(), default=0)}")
    failed = traffic.failed + len(placement["sweep_errors"])
    print(f"{'PASS' if failed == 0 else 'MISS'}: {failed} errors under Zipf traffic and the "
          f"sweep (goal 0)")
    ok = len(replicas) == 2 and max(holders.values(), default=0) <= 2
    print(f"{'PASS' if ok else 'MISS'}: each model resident on <= 2 replicas at the end "
          f"({len(replicas)} replicas reported)")


if __name__ == "__main__":
    main()
