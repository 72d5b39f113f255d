"""Density benchmark: thousands of per-tenant models on one box, under a memory budget.

Generates N small classifier heads (384 -> 256 -> 32, distinct weights), serves them with
`--model-control lazy --memory-budget B`, and measures in one run:
  1. start-up time (process start to ready) with N models indexed;
  2. Zipf(1.1)-distributed traffic at 64 clients: throughput, p50/p99, errors, loads,
     evictions, hit rate, RSS sampled over time against the budget;
  3. cold loads: first requests to models never used (p50/p99);
  4. hot requests: the most popular, resident models (p50/p99).
A second run with a budget that holds every model loads all N and reports RSS per model.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/many_models.py --models 10000
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import orjson
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers
from serval.loadtest.closed_loop import run_closed_loop
from serval.loadtest.http_client import encode_http_request

IN, HIDDEN, OUT = 384, 256, 32
WEIGHT_BYTES = (IN * HIDDEN + HIDDEN * OUT) * 4
GOALS = {"hot_p99_ms": 10.0, "cold_p99_ms": 50.0, "startup_s": 5.0, "rss_slack_mb": 300.0}


def main() -> None:
    args = _parse_args()
    repository = args.repository or Path(tempfile.mkdtemp(prefix="serval-many-"))
    started = time.perf_counter()
    _generate(repository, args.models)
    print(f"generated {args.models:,} models in {time.perf_counter() - started:.0f} s "
          f"({_disk_mb(repository):,.0f} MB) under {repository}")
    budget_mb = args.budget_mb
    _budget_run(args, repository, budget_mb)
    if not args.skip_all_resident:
        _all_resident_run(args, repository)
    if args.repository is None and not args.keep:
        shutil.rmtree(repository, ignore_errors=True)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--budget-mb", type=int, default=1024)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--repository", type=Path, default=None,
                        help="reuse or keep the generated repository here")
    parser.add_argument("--keep", action="store_true", help="keep the generated repository")
    parser.add_argument("--skip-all-resident", action="store_true")
    return parser.parse_args()


# --- the models ------------------------------------------------------------------------------

def _template() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["a"]),
         helper.make_node("MatMul", ["a", "W2"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1)],
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", OUT])],
        initializer=[numpy_helper.from_array(np.zeros((IN, HIDDEN), np.float32), "W1"),
                     numpy_helper.from_array(np.zeros((HIDDEN, OUT), np.float32), "W2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _generate(repository: Path, count: int) -> None:
    """Model i is a head with weights from seed i (skips models already there)."""
    template = _template()

    def write(index: int) -> None:
        folder = repository / f"tenant{index:05d}" / "1"
        if (folder / "model.onnx").exists():
            return
        rng = np.random.default_rng(index)
        model = onnx.ModelProto()
        model.CopyFrom(template)
        for init, shape in zip(model.graph.initializer, ((IN, HIDDEN), (HIDDEN, OUT)),
                               strict=True):
            weights = rng.standard_normal(shape, dtype=np.float32) / np.sqrt(shape[0])
            init.raw_data = weights.astype(np.float32).tobytes()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "model.onnx").write_bytes(model.SerializeToString())

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(count)))


# --- one server run --------------------------------------------------------------------------

def _budget_run(args: argparse.Namespace, repository: Path, budget_mb: int) -> None:
    port = servers.free_port()
    command = [*servers.serval_command(repository, port, 1, 0),
               "--model-control", "lazy", "--memory-budget", f"{budget_mb}MiB",
               "--metrics-top-k", "20"]
    started = time.perf_counter()
    with servers.running(command, port, "/v2/health/ready", repository.parent / "many.log"):
        startup_s = time.perf_counter() - started
        names = [f"tenant{i:05d}" for i in range(args.models)]
        rss = _RssSampler(port)
        rss.start()
        zipf = _zipf_requests(names, args.zipf, 20_000)
        traffic = run_closed_loop(servers.HOST, port, zipf, args.clients, args.duration, 5.0)
        cold = _cold_latencies(port, names[-200:])
        hot = run_closed_loop(servers.HOST, port, _requests(names[:20]), args.clients, 10.0, 2.0)
        hot4 = run_closed_loop(servers.HOST, port, _requests(names[:20]), 4, 10.0, 1.0)
        rss.stop()
        metrics = _metrics(port)
    loads, evictions = metrics["serval_model_loads_total"], metrics["serval_model_evictions_total"]
    rss_peak_mb = max(rss.samples) / 2**20
    print(f"\n== {args.models:,} models, lazy, budget {budget_mb} MiB ==")
    print(f"start-up to ready: {startup_s:.2f} s")
    print(f"Zipf({args.zipf}) @{args.clients}: {traffic.throughput_rps:,.0f} req/s, p50 "
          f"{traffic.p50_ms:.2f} ms, p99 {traffic.p99_ms:.2f} ms, errors {traffic.errors or 0}")
    print(f"loads {loads:,.0f}, evictions {evictions:,.0f}, hit rate "
          f"{1 - loads / max(1, traffic.requests + hot.requests + len(cold)):.1%}")
    print(f"cold first requests: p50 {np.percentile(cold, 50):.1f} ms, p99 "
          f"{np.percentile(cold, 99):.1f} ms")
    print(f"hot (20 resident models) @{args.clients}: {hot.throughput_rps:,.0f} req/s, p50 "
          f"{hot.p50_ms:.2f} ms, p99 {hot.p99_ms:.2f} ms; @4 clients: p50 {hot4.p50_ms:.2f} ms, "
          f"p99 {hot4.p99_ms:.2f} ms")
    print(f"RSS: peak {rss_peak_mb:,.0f} MiB, final {rss.samples[-1] / 2**20:,.0f} MiB "
          f"(budget {budget_mb} MiB + goal slack {GOALS['rss_slack_mb']:.0f})")
    _goals(startup_s, traffic.failed + hot.failed, hot.p99_ms, float(np.percentile(cold, 99)),
           rss_peak_mb, budget_mb)


def _all_resident_run(args: argparse.Namespace, repository: Path) -> None:
    port = servers.free_port()
    command = [*servers.serval_command(repository, port, 1, 0),
               "--model-control", "lazy", "--metrics-top-k", "20"]
    with servers.running(command, port, "/v2/health/ready", repository.parent / "all.log"):
        before = _metrics(port)["process_resident_memory_bytes"]
        names = [f"tenant{i:05d}" for i in range(args.models)]
        started = time.perf_counter()
        result = run_closed_loop(servers.HOST, port, _requests(names), 8,
                                 duration_s=max(30.0, args.models / 150), warmup_s=0.0)
        metrics = _metrics(port)
    loaded = metrics["serval_model_loads_total"]
    grown = (metrics["process_resident_memory_bytes"] - before) / max(1, loaded)
    print(f"\n== all resident: {loaded:,.0f} of {args.models:,} models loaded in "
          f"{time.perf_counter() - started:.0f} s, errors {result.errors or 0}; RSS "
          f"{metrics['process_resident_memory_bytes'] / 2**30:.2f} GiB = "
          f"{grown / 2**10:,.0f} KiB per model (weights {WEIGHT_BYTES / 1024:.0f} KiB)")


# --- helpers ---------------------------------------------------------------------------------

def _requests(names: list[str]) -> list[bytes]:
    body_by_seed = {}
    out = []
    for name in names:
        seed = len(body_by_seed) % 8
        body = body_by_seed.setdefault(seed, orjson.dumps({"inputs": [{
            "name": "x", "datatype": "FP32", "shape": [1, IN],
            "data": np.random.default_rng(seed).standard_normal(IN).astype(np.float32).tolist(),
        }]}))
        out.append(encode_http_request("POST", f"/v2/models/{name}/infer", body,
                                       {"Content-Type": "application/json"}, servers.HOST))
    return out


def _zipf_requests(names: list[str], exponent: float, count: int) -> list[bytes]:
    ranks = np.arange(1, len(names) + 1, dtype=np.float64)
    weights = ranks ** -exponent
    picks = np.random.default_rng(7).choice(len(names), size=count, p=weights / weights.sum())
    return _requests([names[i] for i in picks])


def _cold_latencies(port: int, names: list[str]) -> list[float]:
    """Milliseconds of each model's first request (a load), one at a time."""
    connection = http.client.HTTPConnection(servers.HOST, port, timeout=60)
    latencies = []
    for name in names:
        body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, IN],
                                         "data": [0.1] * IN}]})
        started = time.perf_counter()
        connection.request("POST", f"/v2/models/{name}/infer", body)
        reply = connection.getresponse()
        reply.read()
        if reply.status == 200:
            latencies.append((time.perf_counter() - started) * 1e3)
    connection.close()
    return latencies


def _metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{servers.HOST}:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^([a-z_]+) ([0-9.e+]+)$", text, re.MULTILINE)}


class _RssSampler(threading.Thread):
    """The server's RSS 4 times a second from /proc (a scrape would perturb what it measures)."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.pid = _server_pid(port)
        self.samples, self._halt = [self._rss()], threading.Event()

    def _rss(self) -> float:
        status = Path(f"/proc/{self.pid}/status").read_text()
        return float(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]

    def run(self) -> None:
        while not self._halt.wait(0.25):
            self.samples.append(self._rss())

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.samples.append(self._rss())


def _server_pid(port: int) -> int:
    """The serving process: the one holding the listening socket of `port`."""
    inode_by_port = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A":  # LISTEN
            inode_by_port[int(fields[1].split(":")[1], 16)] = fields[9]
    inode = inode_by_port[port]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                links = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
            except OSError:
                continue
            if f"socket:[{inode}]" in links:
                return int(proc.name)
    raise RuntimeError(f"no process listens on port {port}")


def _goals(startup_s: float, failed: int, hot_p99: float, cold_p99: float, rss_mb: float,
           budget_mb: int) -> None:
    checks = [
        (failed == 0, f"zero failed requests ({failed})"),
        (rss_mb <= budget_mb + GOALS["rss_slack_mb"],
         f"RSS <= budget + 300 MB ({rss_mb:,.0f} MiB vs {budget_mb} MiB)"),
        (hot_p99 <= GOALS["hot_p99_ms"], f"hot p99 <= 10 ms ({hot_p99:.2f} ms)"),
        (cold_p99 <= GOALS["cold_p99_ms"], f"cold-load p99 <= 50 ms ({cold_p99:.1f} ms)"),
        (startup_s <= GOALS["startup_s"], f"start-up <= 5 s ({startup_s:.2f} s)"),
    ]
    for passed, text in checks:
        print(f"{'PASS' if passed else 'MISS'}  {text}")


def _disk_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*.onnx")) / 2**20


if __name__ == "__main__":
    main()
