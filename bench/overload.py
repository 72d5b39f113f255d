"""Overload goodput: the 64-client rate, then 2,000 clients against the same server.

Serves the example model (`lstm` by default) with a default deadline (`--default-timeout-ms`),
drives a closed loop of keep-alive clients sending binary-tensor requests (two generator
processes; the open-file limit is raised to the hard limit): first --base-clients (64) to find
the model's rate, then --clients (2,000) that send again at once after a 429 (a retry storm:
the harshest closed loop), then --clients polite ones that wait Retry-After. Prints the
64-client rate, the 2,000-client accepted rate, their ratio (goodput), the accepted p50/p99
against the timeout, status counts and the server's RSS, with PASS/MISS against each goal
(only 200/429, p99 within the timeout, goodput >= 90%).

    .venv/bin/python bench/overload.py --repository examples/models [--clients 2000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import procs, servers
from serval.loadtest.closed_loop import run_closed_loop
from serval.loadtest.stats import StepResult
from serval.loadtest.workloads import generated_feeds, http_requests, model_inputs

RSS_BOUND_BYTES = 2 * 1024**3
GOODPUT_GOAL = 0.90


def main() -> None:
    args = _parse_args()
    limit = procs.raise_open_files_limit()
    if limit < 2 * args.clients + 256:
        sys.exit(f"open-file limit {limit} is too low for {args.clients} clients; raise ulimit -n")
    root = Path(tempfile.mkdtemp(prefix="serval-overload-"))
    shutil.copytree(args.repository / args.model, root / args.model)
    port = servers.free_port()
    command = [*servers.serval_command(root, port, 1, 0),
               "--default-timeout-ms", str(args.timeout_ms)]
    samples: list[int] = []
    with servers.running(command, port, "/v2/health/ready", root / "server.log"):
        pid = procs.server_pid(port)
        base_url = f"http://{servers.HOST}:{port}"
        feeds = generated_feeds(model_inputs(base_url, args.model), 1, 16)
        requests = http_requests(args.model, feeds, True, servers.HOST)
        base = run_closed_loop(servers.HOST, port, requests, args.base_clients, args.duration,
                               warmup_s=3.0, processes=2, timeout_s=60.0)
        stop = threading.Event()
        sampler = threading.Thread(target=_sample, args=(pid, samples, stop), daemon=True)
        sampler.start()
        load = run_closed_loop(servers.HOST, port, requests, args.clients, args.duration,
                               warmup_s=5.0, processes=2, timeout_s=60.0)
        polite = run_closed_loop(servers.HOST, port, requests, args.clients, args.duration,
                                 warmup_s=5.0, processes=2, timeout_s=60.0,
                                 honour_retry_after=True)
        stop.set()
        alive = bool(servers.get_json(port, "/v2").get("name"))
        stats = servers.get_json(port, f"/v2/models/{args.model}/stats")
    shutil.rmtree(root, ignore_errors=True)
    _report(args, base, load, polite, samples, alive, stats)


def _sample(pid: int, samples: list[int], stop: threading.Event) -> None:
    while not stop.wait(1.0):
        samples.append(procs.tree_rss_bytes(pid))


def _report(args: argparse.Namespace, base: StepResult, load: StepResult, polite: StepResult,
            samples: list[int], alive: bool, stats: dict[str, object]) -> None:
    refused = load.errors.get("http_429", 0)
    others = {k: v for k, v in load.errors.items() if k != "http_429"}
    peak = max(samples, default=0)
    ratio = load.throughput_rps / base.throughput_rps if base.throughput_rps else 0.0
    load_avg = os.getloadavg()
    print(f"{args.model}, binary tensors, --default-timeout-ms {args.timeout_ms:.0f}, "
          f"{args.duration:.0f} s per step; load average at the end {load_avg[0]:.1f} "
          f"on {os.cpu_count()} cores")
    print(f"{args.base_clients} clients: {base.throughput_rps:.0f} req/s, p50 {base.p50_ms:.0f} "
          f"ms, p99 {base.p99_ms:.0f} ms, statuses {_statuses(base)}")
    print(f"{args.clients} clients: accepted {load.throughput_rps:.0f} req/s, "
          f"p50 {load.p50_ms:.0f} ms, p99 {load.p99_ms:.0f} ms, statuses {_statuses(load)}; "
          f"429s {refused / (args.duration + 5.0):.0f}/s")
    print(f"goodput: {ratio:.0%} of the {args.base_clients}-client rate")
    print(f"{args.clients} clients honouring Retry-After: accepted {polite.throughput_rps:.0f} "
          f"req/s ({polite.throughput_rps / max(base.throughput_rps, 1e-9):.0%}), p50 "
          f"{polite.p50_ms:.0f} ms, p99 {polite.p99_ms:.0f} ms, statuses {_statuses(polite)}")
    print(f"server RSS: first {samples[0] / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB "
          f"(bound {RSS_BOUND_BYTES / 2**20:.0f} MiB)" if samples else "no RSS samples")
    print(f"server statistics: {orjson.dumps(stats)[:300].decode()}")
    _verdict("server stayed up", alive)
    _verdict("every response 200 or 429", not others)
    _verdict(f"accepted p99 {load.p99_ms:.0f} ms within the {args.timeout_ms:.0f} ms timeout",
             load.p99_ms <= args.timeout_ms)
    _verdict(f"goodput {ratio:.0%} >= {GOODPUT_GOAL:.0%} of the {args.base_clients}-client rate",
             ratio >= GOODPUT_GOAL)
    _verdict(f"RSS peak {peak / 2**20:.0f} MiB under {RSS_BOUND_BYTES / 2**20:.0f} MiB",
             0 < peak < RSS_BOUND_BYTES)


def _statuses(result: StepResult) -> dict[str, int]:
    return {"http_200": result.answered, **result.errors}


def _verdict(goal: str, ok: bool) -> None:
    print(f"{'PASS' if ok else 'MISS'}: {goal}")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--model", default="lstm")
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--base-clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per step")
    parser.add_argument("--timeout-ms", type=float, default=2000.0)
    return parser.parse_args()


if __name__ == "__main__":
    main()
