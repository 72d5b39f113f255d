"""Scale-out benchmark: Serval nodes behind HAProxy (serval.cluster.local.LocalCluster), on this
machine, every figure a ratio measured in one run, printed with PASS/MISS against its goal.

1. efficiency: N nodes (--nodes, default 2) each held to --node-cpus (default 0.5) by a cgroup
   CPU quota, `mlp` and `lstm` at --clients (64), REST JSON, REST binary tensors and gRPC:
   throughput through the proxy / (N x one node at the same quota served directly), median of
   --repeats (goal >= 0.9); also proxied / the same clients split over the N nodes' own ports
   at once (the proxy's own cost at equal per-node concurrency). Also the proxy's CPU per
   request (its worker's utime+stime from /proc over the run / answers), the load generator's
   own CPU per request, the nodes' CPU against their quota, the box's idle share, and the
   proxy's added p50 at 1 client. The generator (serval.loadtest closed loops, HTTP and raw
   HTTP/2 gRPC) and HAProxy run outside the node cgroups, on the same 2 cores.
2. locality: --models (10,000) tiny ONNX heads in a temporary repository, 4 nodes each with a
   --memory-budget holding 30% of them, a Zipf(1.1) i.i.d. stream at --clients after a warm-up:
   share of requests that found their model resident on the node that served them (from each
   node's /status cache_hits/cache_misses deltas; goal >= 95%; the same share with the first-ever
   requests of a model left out, since no node can hold those), resident copies (sum over nodes of
   READY models) / distinct models requested (goal <= 1.3), errors (goal 0). `--hot-rate` and
   `--balance-factor` set the proxy's ProxySettings.
3. loss: 3 nodes at the quota under a model mix; `kill -9` one node: failed requests (goal 0: the
   proxy retries on another node), per-second throughput, first second back at >= (N-1)/N of
   before (goal <= 5 s); then the node restarts (LocalCluster.restart_node) and takes its share
   back (goal: 0 errors, its share of answers).
4. publish: 3 nodes polling the shared repository (--poll-interval-s 0.5) serve `mlp` v1 under
   load; version 2 is published (serval.repository.store.publish: staged, then renamed in); failed
   requests (goal 0) and when each node answered with v2 first / v1 last.
--ray: Ray Serve (Serval on Ray, serval.cluster.ray) with the same total CPU quota (Ray's
   processes in one cgroup of N x --node-cpus) vs the cluster through HAProxy, `lstm` binary at
   --clients (goal: the cluster >= 10x the Ray path).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/cluster.py [--quick] \
        [--only efficiency,locality,loss,publish] [--ray]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import orjson
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import procs, workloads
from bench.timeline import TimelineLoad
from serval.backends.onnxruntime import SESSION_OVERHEAD_BYTES
from serval.cluster.haproxy import ProxySettings
from serval.cluster.local import ClusterSpec, LocalCluster
from serval.loadtest.closed_loop import run_closed_loop
from serval.loadtest.grpc_closed_loop import run_grpc_closed_loop
from serval.loadtest.http_client import encode_http_request
from serval.loadtest.stats import StepResult
from serval.ports import free_ports
from serval.repository import store

HOST = "127.0.0.1"
PARTS = ("efficiency", "locality", "loss", "publish")
GOAL_EFFICIENCY = 0.9
GOAL_LOCAL = 0.95
GOAL_COPIES = 1.3
GOAL_RECOVERY_S = 5
GOAL_RAY = 10.0
IN, HIDDEN, OUT = 64, 64, 8  # the tiny heads
CLK_TCK = os.sysconf("SC_CLK_TCK")


def main() -> None:
    args = _parse_args()
    procs.raise_open_files_limit()
    work = Path(tempfile.mkdtemp(prefix="serval-benchcl-"))
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} nodes={args.nodes} node_cpus={args.node_cpus} "
          f"clients={args.clients} hot_rate={args.hot_rate} balance_factor="
          f"{args.balance_factor} cores={len(os.sched_getaffinity(0))} work={work}", flush=True)
    verdicts: list[str] = []
    efficiency: dict[str, Any] = {}
    try:
        if "efficiency" in args.only:
            efficiency = _efficiency(args, work, verdicts)
        if "locality" in args.only:
            _locality(args, work, verdicts)
        if "loss" in args.only:
            _loss(args, work, verdicts)
        if "publish" in args.only:
            _publish(args, work, verdicts)
        if args.ray:
            _ray_section(args, work, efficiency, verdicts)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("\n== verdicts ==")
    for line in verdicts:
        print(line)
    if args.json_out:
        args.json_out.write_bytes(orjson.dumps({
            "cpu": procs.cpu_features(), "nodes": args.nodes, "node_cpus": args.node_cpus,
            "clients": args.clients, "duration_s": args.duration, "repeats": args.repeats,
            "models": args.models, "parts": sorted(args.only), "ray": args.ray,
            "verdicts": [{"passed": line.startswith("PASS"), "text": line.split(": ", 1)[1]}
                         for line in verdicts]}, option=orjson.OPT_INDENT_2))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--quick", action="store_true", help="short runs, 1 repeat, 2,000 models")
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"comma-separated parts among {', '.join(PARTS)}")
    parser.add_argument("--ray", action="store_true", help="also Ray Serve at the same quota")
    parser.add_argument("--nodes", type=int, default=2, help="nodes in the efficiency part")
    parser.add_argument("--node-cpus", type=float, default=0.5)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=None, help="seconds per measurement")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--models", type=int, default=None, help="models in the locality part")
    parser.add_argument("--locality-s", type=float, default=None,
                        help="locality: seconds of warm-up, then as many measured")
    parser.add_argument("--hot-rate", type=int, default=ProxySettings.hot_rate)
    parser.add_argument("--balance-factor", type=int, default=ProxySettings.balance_factor)
    parser.add_argument("--proxy-buffer-kib", type=int, default=ProxySettings.buffer_kib)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    parser.add_argument("--node-arg", action="append", default=[],
                        help="one more `serve` flag for every node (repeat: --node-arg=--x)")
    parser.add_argument("--efficiency-models", default="mlp,lstm")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="the verdicts as JSON (docs/results/cluster.json)")
    args = parser.parse_args()
    args.only = {p.strip() for p in args.only.split(",") if p.strip()}
    if unknown := args.only - set(PARTS):
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    args.duration = args.duration or (4.0 if args.quick else 10.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.models = args.models or (2_000 if args.quick else 10_000)
    args.locality_s = args.locality_s or (15.0 if args.quick else 40.0)
    args.repository = args.repository.resolve()
    return args


# --- shared helpers ----------------------------------------------------------------------------

@contextlib.contextmanager
def _cluster(work: Path, label: str, repo: Path, nodes: int, node_cpus: float | None,
             args: argparse.Namespace, node_args: tuple[str, ...] = ()
             ) -> Iterator[LocalCluster]:
    run_dir = work / f"run-{label}"
    http_port, grpc_port = free_ports(2)
    spec = ClusterSpec(repository=repo, nodes=nodes, http_port=http_port,
                       grpc_port=grpc_port, node_cpus=node_cpus,
                       node_args=("--log-level", "warning", *node_args),
                       proxy=ProxySettings(hot_rate=args.hot_rate,
                                           balance_factor=args.balance_factor,
                                           buffer_kib=args.proxy_buffer_kib),
                       restart=False, run_dir=run_dir)
    cluster = LocalCluster(spec)
    started = time.perf_counter()
    cluster.start()
    print(f"[{label}] {nodes} nodes + HAProxy up in {time.perf_counter() - started:.1f} s "
          f"(logs: {run_dir})", flush=True)
    try:
        yield cluster
    finally:
        cluster.stop()


def _example_repo(work: Path, args: argparse.Namespace, models: tuple[str, ...]) -> Path:
    repo = work / f"repo-{'-'.join(models)}"
    repo.mkdir(exist_ok=True)
    for model in models:
        if not (repo / model).exists():
            (repo / model).symlink_to(args.repository / model)
    return repo


def _feeds_requests(args: argparse.Namespace, model: str, count: int = 64
                    ) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """(REST JSON, REST binary, gRPC) requests for `model`, one row each."""
    spec = workloads.model_spec(workloads.model_file(args.repository, model))
    feeds = workloads.random_feeds(spec, 1, count)
    return (workloads.infer_requests(model, feeds, False, HOST),
            workloads.infer_requests(model, feeds, True, HOST),
            workloads.grpc_requests(model, feeds))


def _cpu_ticks(pid: int) -> int:
    """utime + stime of one process, in clock ticks (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return 0


def _proxy_worker(cluster: LocalCluster) -> int:
    master = cluster.proxy.pid
    assert master is not None
    workers = procs.children(master)
    return max(workers) if workers else master  # the newest worker after a reload


def _idle_ticks() -> tuple[int, int]:
    """(idle, total) jiffies of the whole box."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return values[3] + values[4], sum(values[:8])


def _self_cpu_s() -> float:
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def _get_json(port: int, path: str, method: str = "GET", body: bytes | None = None
              ) -> Any:
    connection = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        connection.request(method, path, body=body)
        return orjson.loads(connection.getresponse().read())
    finally:
        connection.close()


def _verdict(verdicts: list[str], ok: bool, text: str) -> None:
    line = f"{'PASS' if ok else 'MISS'}: {text}"
    verdicts.append(line)
    print(line, flush=True)


# --- 1. efficiency ------------------------------------------------------------------------------

class _Measured:
    """One load run and what it cost: the step, the proxy's and the generator's CPU, box idle."""

    def __init__(self, step: StepResult, proxy_ms: float, client_ms: float, idle: float,
                 node_cpus: float) -> None:
        self.step, self.proxy_ms, self.client_ms, self.idle = step, proxy_ms, client_ms, idle
        self.node_cpus = node_cpus  # CPUs the nodes used on average during the run


def _tree_ticks(pids: list[int]) -> int:
    return sum(_cpu_ticks(p) for root in pids for p in procs.tree(root))


def _measure(run: Callable[[], StepResult], proxy_pid: int | None,
             node_pids: list[int]) -> _Measured:
    nodes_before = _tree_ticks(node_pids)
    started = time.perf_counter()
    proxy_before = _cpu_ticks(proxy_pid) if proxy_pid else 0
    client_before = _self_cpu_s()
    idle_before, total_before = _idle_ticks()
    step = run()
    idle_after, total_after = _idle_ticks()
    answers = max(1, step.answered)
    proxy_ms = ((_cpu_ticks(proxy_pid) - proxy_before) * 1000 / CLK_TCK / answers
                if proxy_pid else 0.0)
    client_ms = (_self_cpu_s() - client_before) * 1000 / answers
    idle = (idle_after - idle_before) / max(1, total_after - total_before)
    node_cpus = (_tree_ticks(node_pids) - nodes_before) / CLK_TCK / (time.perf_counter() - started)
    return _Measured(step, proxy_ms, client_ms, idle, node_cpus)


def _efficiency(args: argparse.Namespace, work: Path, verdicts: list[str]) -> dict[str, Any]:
    models = tuple(args.efficiency_models.split(","))
    repo = _example_repo(work, args, models)
    rows: list[tuple[str, str, list[_Measured], list[_Measured], _Measured, _Measured]] = []
    spreads: dict[tuple[str, str], list[_Measured]] = {}
    with _cluster(work, "efficiency", repo, args.nodes, args.node_cpus, args,
                  tuple(args.node_arg)) as cluster:
        node = cluster.nodes[0].node
        proxy_pid = _proxy_worker(cluster)
        node_pids = [n.pid for n in cluster.nodes if n.pid]
        for model in models:
            json_requests, binary_requests, grpc_requests = _feeds_requests(args, model)
            for protocol, requests in (("REST JSON", json_requests),
                                       ("REST binary", binary_requests),
                                       ("gRPC", grpc_requests)):
                def load(port: int, clients: int, duration: float, warmup: float,
                         requests: list[bytes] = requests, protocol: str = protocol
                         ) -> StepResult:
                    if protocol == "gRPC":
                        return run_grpc_closed_loop(f"{HOST}:{port}", requests, clients,
                                                    duration, warmup)
                    return run_closed_loop(HOST, port, requests, clients, duration, warmup)

                grpc = protocol == "gRPC"
                ports = [(n.node.grpc_port if grpc else n.node.http_port) or 0
                         for n in cluster.nodes]

                def all_direct(load: Callable[..., StepResult] = load,
                               ports: list[int] = ports) -> StepResult:
                    return _together(load, ports, args.clients, args.duration, 1.0)

                direct_port = node.grpc_port if grpc else node.http_port
                proxy_port = cluster.spec.grpc_port if grpc else cluster.spec.http_port
                assert direct_port and proxy_port
                load(proxy_port, args.clients, 2.0, 0.5)  # every node loads the model
                direct: list[_Measured] = []
                proxied: list[_Measured] = []
                spread: list[_Measured] = []
                heavy = functools.partial(load, clients=args.clients, duration=args.duration,
                                          warmup=1.0)
                light = functools.partial(load, clients=1, duration=args.duration / 2,
                                          warmup=0.5)
                for _ in range(args.repeats):
                    spread.append(_measure(all_direct, None, node_pids))
                    direct.append(_measure(functools.partial(heavy, direct_port), None,
                                           node_pids))
                    proxied.append(_measure(functools.partial(heavy, proxy_port), proxy_pid,
                                            node_pids))
                one_direct = _measure(functools.partial(light, direct_port), None, node_pids)
                one_proxy = _measure(functools.partial(light, proxy_port), proxy_pid, node_pids)
                rows.append((model, protocol, direct, proxied, one_direct, one_proxy))
                spreads[(model, protocol)] = spread
                _efficiency_row(args, *rows[-1])
        served = Counter({s.name: s.requests for s in cluster.api.servers()})
    print(f"\n== efficiency: {args.nodes} nodes x {args.node_cpus} CPU through HAProxy vs "
          f"{args.nodes} x one node direct, {args.clients} clients, median of {args.repeats} x "
          f"{args.duration:.0f} s ==")
    print(f"{'model':<6}{'protocol':<13}{'direct/s':>10}{'x N':>9}{'proxy/s':>9}{'ratio':>7}"
          f"{'err':>5}{'all d/s':>9}{'ratio':>7}{'nodes CPU d/p':>14}{'proxy CPU':>10}"
          f"{'gen CPU':>9}{'idle':>6}"
          f"{'p50 1c d':>10}{'+proxy':>8}")
    result: dict[str, Any] = {}
    for model, protocol, direct, proxied, one_direct, one_proxy in rows:
        ratio, direct_rps, proxy_rps = _ratios(args, direct, proxied)
        spread = spreads[(model, protocol)]
        errors = sum(m.step.failed for m in direct + proxied + spread + [one_direct, one_proxy])
        print(f"{model:<6}{protocol:<13}{direct_rps:>10,.0f}{args.nodes * direct_rps:>9,.0f}"
              f"{proxy_rps:>9,.0f}{ratio:>7.2f}{errors:>5}"
              f"{statistics.median(m.step.throughput_rps for m in spread):>9,.0f}"
              f"{_spread_ratio(spread, proxied):>7.2f}"
              f"{statistics.median(m.node_cpus for m in direct):>8.2f}/"
              f"{statistics.median(m.node_cpus for m in proxied):<5.2f}"
              f"{statistics.median(m.proxy_ms for m in proxied) * 1000:>8.0f}us"
              f"{statistics.median(m.client_ms for m in proxied) * 1000:>7.0f}us"
              f"{statistics.median(m.idle for m in proxied):>6.0%}"
              f"{one_direct.step.p50_ms:>8.2f}ms"
              f"{one_proxy.step.p50_ms - one_direct.step.p50_ms:>+6.2f}ms")
        result[f"{model} {protocol}"] = proxy_rps
    print(f"(all d/s: the same {args.clients} clients split over the {args.nodes} nodes' own "
          "ports at once, no proxy; its ratio: proxied / that, i.e. the proxy's own cost at the "
          "same per-node concurrency and box load; "
          f"nodes CPU d/p: CPUs all nodes used, direct (one node driven) / proxied (quota "
          f"{args.nodes} x {args.node_cpus}); proxy CPU: HAProxy worker utime+stime per answer; "
          "gen CPU: the load generator's per answer; idle: the box's idle share during the "
          "proxied runs (other work on the box counts); p50 1c d: direct p50 at 1 client, "
          "+proxy: what the proxy adds to it)")
    print("requests per node in the proxy's backends: "
          + ", ".join(f"{name} {count:,}" for name, count in sorted(served.items())))
    for model, protocol, direct, proxied, _, _ in rows:
        ratio, _, _ = _ratios(args, direct, proxied)
        errors = sum(m.step.failed for m in direct + proxied)
        used = statistics.median(m.node_cpus for m in proxied)
        note = ""
        if ratio < GOAL_EFFICIENCY:
            rps = statistics.median(m.step.throughput_rps for m in proxied)
            proxy_cpus = statistics.median(m.proxy_ms for m in proxied) * rps / 1000
            gen_cpus = statistics.median(m.client_ms for m in proxied) * rps / 1000
            idle = statistics.median(m.idle for m in proxied)
            note = (f" [while proxied: nodes {used:.2f} of their {args.nodes * args.node_cpus:g} "
                    f"CPU quota, HAProxy {proxy_cpus:.2f} CPU, generator {gen_cpus:.2f} CPU, "
                    f"box idle {idle:.0%} of {len(os.sched_getaffinity(0))} cores"
                    + _starved_note(used, statistics.median(m.node_cpus for m in direct),
                                    args.nodes, idle)
                    + "]")
        _verdict(verdicts, ratio >= GOAL_EFFICIENCY and errors == 0,
                 f"efficiency {model} {protocol}: {ratio:.2f} of {args.nodes} x direct "
                 f"(goal >= {GOAL_EFFICIENCY}), {errors} errors{note}")
    return result


def _starved_note(used: float, direct_used: float, nodes: int, idle: float) -> str:
    """Why the nodes used less CPU through the proxy than one node driven directly (whose CPU
    is the most a node of this protocol takes at this quota), as far as the run shows."""
    if used >= 0.9 * nodes * direct_used:
        return ""
    if idle < 0.1:
        return "; the nodes were starved below their direct CPU: the shared cores are the limit"
    return ("; the nodes used less CPU than a node driven directly, with cores idle: the "
            "proxied path does not keep them busy")


def _efficiency_row(args: argparse.Namespace, model: str, protocol: str, direct: list[_Measured],
                    proxied: list[_Measured], one_direct: _Measured, one_proxy: _Measured
                    ) -> None:
    ratio, _, _ = _ratios(args, direct, proxied)
    print(f"  {model} {protocol}: direct {[round(m.step.throughput_rps) for m in direct]} "
          f"proxy {[round(m.step.throughput_rps) for m in proxied]} -> {ratio:.2f}; 1 client "
          f"p50 {one_direct.step.p50_ms:.2f} / {one_proxy.step.p50_ms:.2f} ms; errors "
          f"{[m.step.errors for m in direct + proxied if m.step.errors]}", flush=True)


def _together(load: Callable[..., StepResult], ports: list[int], clients: int,
              duration: float, warmup: float) -> StepResult:
    """`clients` split over `ports`, each share its own closed loop (a thread each), merged."""
    shares = [clients // len(ports) + (i < clients % len(ports)) for i in range(len(ports))]
    with ThreadPoolExecutor(len(ports)) as pool:
        steps = list(pool.map(lambda a: load(*a), [(port, share, duration, warmup)
                                                   for port, share in zip(ports, shares,
                                                                          strict=True)]))
    first = steps[0]
    errors: Counter[str] = Counter()
    for step in steps:
        errors.update(step.errors)
    return StepResult(
        concurrency=clients, requests=sum(s.requests for s in steps), errors=dict(errors),
        duration_s=duration, throughput_rps=sum(s.throughput_rps for s in steps),
        p50_ms=statistics.median(s.p50_ms for s in steps), p90_ms=first.p90_ms,
        p99_ms=max(s.p99_ms for s in steps), p999_ms=first.p999_ms, mean_ms=first.mean_ms,
        answered=sum(s.answered for s in steps))


def _spread_ratio(spread: list[_Measured], proxied: list[_Measured]) -> float:
    return float(statistics.median(p.step.throughput_rps / max(1e-9, d.step.throughput_rps)
                                   for d, p in zip(spread, proxied, strict=True)))


def _ratios(args: argparse.Namespace, direct: list[_Measured], proxied: list[_Measured]
            ) -> tuple[float, float, float]:
    """(median of the per-repeat ratios, median direct req/s, median proxied req/s)."""
    ratios = [p.step.throughput_rps / max(1e-9, args.nodes * d.step.throughput_rps)
              for d, p in zip(direct, proxied, strict=True)]
    return (statistics.median(ratios), statistics.median(m.step.throughput_rps for m in direct),
            statistics.median(m.step.throughput_rps for m in proxied))


# --- 2. locality -------------------------------------------------------------------------------

def _template() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["a"]),
         helper.make_node("MatMul", ["a", "W2"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1)],
        "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", OUT])],
        initializer=[numpy_helper.from_array(np.zeros((IN, HIDDEN), np.float32), "W1"),
                     numpy_helper.from_array(np.zeros((HIDDEN, OUT), np.float32), "W2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _generate(repo: Path, count: int) -> list[str]:
    """`count` tiny heads (64 -> 64 -> 8) with weights from seed i (as bench/many_models.py)."""
    template = _template()
    names = [f"head{index:05d}" for index in range(count)]

    def write(index: int) -> None:
        folder = repo / names[index] / "1"
        if (folder / "model.onnx").exists():
            return
        rng = np.random.default_rng(index)
        model = onnx.ModelProto()
        model.CopyFrom(template)
        for init, shape in zip(model.graph.initializer, ((IN, HIDDEN), (HIDDEN, OUT)),
                               strict=True):
            init.raw_data = rng.standard_normal(shape, dtype=np.float32).tobytes()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.onnx").write_bytes(model.SerializeToString())

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(count)))
    return names


_HEAD_BODY = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, IN],
                                       "data": [0.1] * IN}]})


def _head_request(name: str) -> bytes:
    request: bytes = encode_http_request("POST", f"/v2/models/{name}/infer", _HEAD_BODY,
                                         {"Content-Type": "application/json"}, HOST)
    return request


def _zipf_picks(count: int, exponent: float, draws: int, seed: int = 7) -> np.ndarray:
    ranks = np.arange(1, count + 1, dtype=np.float64)
    weights = ranks ** -exponent
    order = np.random.default_rng(seed + 1).permutation(count)  # popularity is not name order
    return order[np.random.default_rng(seed).choice(count, size=draws, p=weights / weights.sum())]


def _node_status(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    return {n.node.name: _get_json(n.node.http_port, "/status") for n in cluster.nodes}


def _locality(args: argparse.Namespace, work: Path, verdicts: list[str]) -> None:
    nodes, share = 4, 0.3
    repo = work / "repo-heads"
    started = time.perf_counter()
    names = _generate(repo, args.models)
    model_bytes = (repo / names[0] / "1" / "model.onnx").stat().st_size + SESSION_OVERHEAD_BYTES
    budget = int(share * len(names) * model_bytes)
    print(f"\n[locality] generated {len(names):,} models in {time.perf_counter() - started:.0f} s; "
          f"budget {budget / 2**20:.0f} MiB per node = {share:.0%} of them "
          f"({model_bytes / 1024:.0f} KiB each as the registry counts)", flush=True)
    picks = _zipf_picks(len(names), 1.1, 500_000)
    requests = [_head_request(names[i]) for i in picks]
    node_args = ("--memory-budget", str(budget))
    with _cluster(work, "locality", repo, nodes, None, args, node_args) as cluster:
        load = TimelineLoad(HOST, cluster.spec.http_port, requests, args.clients).start()
        time.sleep(args.locality_s)
        sent_before = load.sent
        before = _node_status(cluster)
        proxy_before = {(s.backend, s.name): s.requests for s in cluster.api.servers()}
        mark = load.now_s()
        time.sleep(args.locality_s)
        after = _node_status(cluster)
        sent_after = load.sent
        proxy_after = {(s.backend, s.name): s.requests for s in cluster.api.servers()}
        end = load.now_s()
        load.stop()
        sent = load.sent
        indexes = {n.node.name: _get_json(n.node.http_port, "/v2/repository/index", "POST",
                                          b"{}") for n in cluster.nodes}
    distinct = len(set(picks[:min(sent, len(requests))].tolist()))
    # first-ever requests of a model inside the measured window: no node can hold it yet
    _, first_index = np.unique(picks[:min(sent_after, len(picks))], return_index=True)
    compulsory = int(np.count_nonzero(first_index >= sent_before))
    measured_answers = load.answers(int(mark) + 1, int(end))
    rps = measured_answers / max(1, int(end) - int(mark) - 1)
    print(f"\n== locality: {len(names):,} models, Zipf(1.1), 4 nodes x budget {share:.0%}, "
          f"{args.clients} clients, {args.locality_s:.0f} s warm-up + {args.locality_s:.0f} s "
          f"measured, hot_rate {args.hot_rate}, balance_factor {args.balance_factor} ==")
    print(f"{'node':<8}{'hits':>9}{'misses':>8}{'local':>8}{'READY':>7}{'loads':>7}"
          f"{'evict':>7}{'home req':>10}{'spread req':>11}")
    hits = misses = ready = 0
    holders: Counter[str] = Counter()
    for name in after:
        h = after[name]["cache_hits"] - before[name]["cache_hits"]
        m = after[name]["cache_misses"] - before[name]["cache_misses"]
        r = int(after[name]["models"]["by_state"].get("READY", 0))
        hits, misses, ready = hits + h, misses + m, ready + r
        for entry in indexes[name]:
            if entry.get("state") == "READY":
                holders[entry["name"]] += 1
        home = proxy_after.get(("http_home", name), 0) - proxy_before.get(("http_home", name), 0)
        spread = (proxy_after.get(("http_spread", name), 0)
                  - proxy_before.get(("http_spread", name), 0))
        print(f"{name:<8}{h:>9,}{m:>8,}{h / max(1, h + m):>8.1%}{r:>7,}"
              f"{after[name]['loads'] - before[name]['loads']:>7,}"
              f"{after[name]['evictions'] - before[name]['evictions']:>7,}{home:>10,}"
              f"{spread:>11,}")
    local = hits / max(1, hits + misses)
    routed = hits / max(1, hits + misses - compulsory)
    copies = ready / max(1, distinct)
    multi = sum(1 for c in holders.values() if c > 1)
    errors = load.error_kinds()
    print(f"measured: {rps:,.0f} req/s, {hits + misses:,} lookups; whole run: {sent:,} requests "
          f"over {distinct:,} distinct models; resident: {ready:,} copies of {len(holders):,} "
          f"models ({multi:,} on more than one node); errors {dict(errors)}")
    _verdict(verdicts, local >= GOAL_LOCAL, f"locality: {local:.1%} of requests found their "
             f"model resident on the node that served them (goal >= {GOAL_LOCAL:.0%})")
    print(f"of the {misses:,} misses, {compulsory:,} were the first request ever for their model "
          f"(no node could hold it); excluding those, {routed:.1%} found their model resident")
    _verdict(verdicts, routed >= GOAL_LOCAL, f"locality (first-ever requests of a model left "
             f"out): {routed:.1%} found it resident (goal >= {GOAL_LOCAL:.0%})")
    _verdict(verdicts, copies <= GOAL_COPIES, f"locality: {ready:,} resident copies = "
             f"{copies:.2f} x the {distinct:,} distinct models requested (goal <= {GOAL_COPIES})")
    _verdict(verdicts, not errors, f"locality: {sum(errors.values())} errors (goal 0)")


# --- 3. node loss ------------------------------------------------------------------------------

def _mix_requests(args: argparse.Namespace, heads: list[str]) -> list[bytes]:
    """mlp, lstm and the heads, shuffled (JSON, one row each)."""
    mlp, _, _ = _feeds_requests(args, "mlp", 32)
    lstm, _, _ = _feeds_requests(args, "lstm", 32)
    mix = mlp + lstm + [_head_request(h) for h in heads for _ in range(8)]
    order = np.random.default_rng(3).permutation(len(mix))
    return [mix[i] for i in order]


def _print_seconds(load: TimelineLoad, first: int, last: int, names: list[str],
                   marks: dict[int, str]) -> None:
    print(f"{'s':>4}{'req/s':>8}" + "".join(f"{n:>8}" for n in names) + f"{'errors':>8}")
    for second, total, by_node, errors in load.per_second(first, last):
        print(f"{second:>4}{total:>8,}" + "".join(f"{by_node.get(n, 0):>8,}" for n in names)
              + f"{errors:>8}  {marks.get(second, '')}")


def _loss(args: argparse.Namespace, work: Path, verdicts: list[str]) -> None:
    nodes = 3
    repo = _example_repo(work, args, ("mlp", "lstm"))
    heads = _generate(repo, 6)
    requests = _mix_requests(args, heads)
    steady_s = 5 if args.quick else 10
    with _cluster(work, "loss", repo, nodes, args.node_cpus, args) as cluster:
        names = cluster.names()
        victim = names[-1]
        load = TimelineLoad(HOST, cluster.spec.http_port, requests, args.clients).start()
        time.sleep(3 + steady_s)
        killed_at = load.now_s()
        process = cluster.node(victim).process
        assert process is not None
        process.kill()
        time.sleep(steady_s)
        restart_from = load.now_s()
        cluster.restart_node(victim)
        ready_at = load.now_s()
        time.sleep(steady_s + 3)
        end = load.now_s()
        load.stop()
        servers = cluster.api.servers()
    kill_s = int(killed_at)
    marks = {kill_s: f"<- kill -9 {victim} at {killed_at:.1f} s",
             int(restart_from): f"<- restart {victim} at {restart_from:.1f} s",
             int(ready_at): f"<- {victim} ready at {ready_at:.1f} s"}
    print(f"\n== node loss: {nodes} nodes x {args.node_cpus} CPU, mlp + lstm + 6 heads, "
          f"{args.clients} clients, per second ==")
    _print_seconds(load, 1, int(end), names, marks)
    before = [t for _, t, _, _ in load.per_second(3, kill_s)]
    baseline = statistics.median(before)
    goal = baseline * (nodes - 1) / nodes
    after = list(load.per_second(kill_s + 1, int(restart_from)))
    back = next((s - killed_at for s, t, _, _ in after if t >= goal), None)
    errors = load.error_kinds()
    retries = sum(s.retries + s.redispatches for s in servers)
    down = [t for _, t, _, _ in after[1:]]
    print(f"before: median {baseline:,.0f} req/s; goal after the kill >= {goal:,.0f}; with "
          f"{nodes - 1} nodes (from 1 s after the kill): median "
          f"{statistics.median(down) if down else 0:,.0f} req/s; proxy retries+redispatches "
          f"{retries}; errors {dict(errors)}")
    tail = list(load.per_second(int(ready_at) + 3, int(end)))
    share = (sum(n.get(victim, 0) for _, _, n, _ in tail) / max(1, sum(t for _, t, _, _ in tail)))
    back_rps = statistics.median(t for _, t, _, _ in tail) if tail else 0.0
    killed_errors = sum(c for (s, _), c in load.errors.items() if s < int(restart_from))
    restart_errors = sum(c for (s, _), c in load.errors.items() if s >= int(restart_from))
    _verdict(verdicts, killed_errors == 0, f"node loss: {killed_errors} failed requests "
             f"around the kill (goal 0)")
    _verdict(verdicts, back is not None and back <= GOAL_RECOVERY_S,
             f"node loss: throughput >= {nodes - 1}/{nodes} of before "
             + (f"by the second ending {back + 1:.1f} s after the kill" if back is not None
                else "never before the restart") + f" (goal <= {GOAL_RECOVERY_S} s)")
    _verdict(verdicts, restart_errors == 0 and share >= 0.5 / nodes,
             f"node loss: after the restart {victim} serves {share:.0%} of requests (even: "
             f"{1 / nodes:.0%}), {back_rps:,.0f} req/s ({back_rps / baseline:.0%} of before), "
             f"{restart_errors} errors (goal 0)")


# --- 4. rolling publish ------------------------------------------------------------------------

def _publish(args: argparse.Namespace, work: Path, verdicts: list[str]) -> None:
    nodes = 3
    repo = work / "repo-publish"
    source = args.repository / "mlp" / "1" / "model.onnx"
    store.publish(source, repo, "mlp", note="v1")
    shutil.copy(args.repository / "mlp" / "config.yaml", repo / "mlp" / "config.yaml")
    (repo / "lstm").symlink_to(args.repository / "lstm")
    mlp, _, _ = _feeds_requests(args, "mlp", 32)
    lstm, _, _ = _feeds_requests(args, "lstm", 8)
    requests = mlp + lstm
    node_args = ("--poll-interval-s", "0.5")
    steady_s = 5 if args.quick else 8
    with _cluster(work, "publish", repo, nodes, args.node_cpus, args, node_args) as cluster:
        names = cluster.names()
        load = TimelineLoad(HOST, cluster.spec.http_port, requests, args.clients,
                            versions=True).start()
        time.sleep(3 + steady_s)
        published_at = load.now_s()
        version = store.publish(source, repo, "mlp", note="v2")
        time.sleep(steady_s + 4)
        end = load.now_s()
        load.stop()
    print(f"\n== rolling publish: mlp v{version} published at {published_at:.1f} s into the "
          f"repository {nodes} nodes poll every 0.5 s; {args.clients} clients on mlp + lstm ==")
    print(f"{'s':>4}{'req/s':>8}" + "".join(f"{n:>8}" for n in names)
          + f"{'mlp v1':>8}{f'mlp v{version}':>8}{'errors':>8}")
    for second, total, by_node, failed in load.per_second(1, int(end)):
        v1 = sum(c for (s, _, v), c in load.ok.items() if s == second and v == "mlp:1")
        v2 = sum(c for (s, _, v), c in load.ok.items() if s == second and v == f"mlp:{version}")
        print(f"{second:>4}{total:>8,}" + "".join(f"{by_node.get(n, 0):>8,}" for n in names)
              + f"{v1:>8,}{v2:>8,}{failed:>8}"
              + ("  <- publish" if second == int(published_at) else ""))
    print(f"{'node':<8}{'v1 last':>10}{'v2 first':>10}   (s after the publish; mlp answers)")
    switched = []
    for name in names:
        last_v1 = load.last_seen.get((name, "mlp:1"))
        first_v2 = load.first_seen.get((name, f"mlp:{version}"))
        rel = [None if t is None else t - published_at for t in (last_v1, first_v2)]
        print(f"{name:<8}" + "".join(f"{'-' if t is None else f'{t:+.2f}':>10}" for t in rel))
        if rel[1] is not None:
            switched.append(max(rel[1], rel[0] or 0.0))
    errors = load.error_kinds()
    _verdict(verdicts, not errors, f"publish: {sum(errors.values())} failed requests during the "
             f"rolling publish (goal 0) {dict(errors) or ''}")
    every = len(switched) == nodes
    _verdict(verdicts, every, f"publish: every node answers v{version} "
             + (f"{max(switched):.2f} s after the publish (last v1 answer or first v2, "
                "whichever is later)" if every else f"only on {len(switched)} of {nodes} nodes"))


# --- --ray: Ray Serve at the same quota --------------------------------------------------------

def _ray_section(args: argparse.Namespace, work: Path, efficiency: dict[str, Any],
                 verdicts: list[str]) -> None:
    from bench.ray_path import ray_lstm  # the Ray code of the former bench/cluster.py

    _, binary, _ = _feeds_requests(args, "lstm")
    quota = args.nodes * args.node_cpus
    repo = _example_repo(work, args, ("lstm",))
    ray_step = ray_lstm(repo, binary, args.clients, args.duration, quota)
    cluster_rps = efficiency.get("lstm REST binary")
    if cluster_rps is None:
        with _cluster(work, "ray-compare", repo, args.nodes, args.node_cpus, args) as cluster:
            run_closed_loop(HOST, cluster.spec.http_port, binary, args.clients, 2.0, 0.5)
            cluster_rps = run_closed_loop(HOST, cluster.spec.http_port, binary, args.clients,
                                          args.duration, 1.0).throughput_rps
    print(f"\n== Ray Serve (proxy + Serval ingress + replica) in a cgroup of {quota:g} CPU vs "
          f"{args.nodes} nodes x {args.node_cpus} CPU behind HAProxy: lstm binary, "
          f"{args.clients} clients ==")
    print(f"ray: {ray_step.throughput_rps:,.0f} req/s p50 {ray_step.p50_ms:.1f} ms p99 "
          f"{ray_step.p99_ms:.1f} ms errors {ray_step.errors}; cluster: {cluster_rps:,.0f} req/s")
    ratio = cluster_rps / max(1e-9, ray_step.throughput_rps)
    _verdict(verdicts, ratio >= GOAL_RAY, f"ray: the HAProxy cluster serves {ratio:.1f}x the "
             f"Ray Serve path at the same {quota:g} CPU (goal >= {GOAL_RAY:.0f}x)")


if __name__ == "__main__":
    main()
