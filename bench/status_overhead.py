"""What the status page costs the serving path: Serval before it existed vs with it, in one run.

Three servers take turns (A B C A B C ...) on `mlp`, one item per JSON request, 64 clients:
  before   the source tree at --baseline-ref (default: the commit before the status page)
  after    this tree (the 1 s sampler runs; nobody watches)
  watched  this tree while a page polls /status, /status/models and one model's detail each second
Prints each round, the median throughput ratios and PASS/MISS against "negligible" (>= 0.97).

    flock /tmp/serval-cpu.lock .venv/bin/python bench/status_overhead.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers
from bench.workloads import infer_requests, model_file, model_spec, random_feeds
from serval.loadtest.closed_loop import StepResult, run_closed_loop

ROOT = Path(__file__).resolve().parent.parent
GOAL_RATIO = 0.97


def main() -> None:
    args = _parse_args()
    for models in (10, 10_000):
        _sampler_cost(models)
    work = Path(tempfile.mkdtemp(prefix="serval-status-bench-"))
    baseline_src = _checkout(args.baseline_ref, work / "baseline")
    feeds = random_feeds(model_spec(model_file(args.repository, args.model)), 1, 16)
    requests = infer_requests(args.model, feeds, binary=False, host=servers.HOST)
    results: dict[str, list[StepResult]] = {"before": [], "after": [], "watched": []}
    for round_index in range(args.rounds):
        for label in results:
            result = _measure(args, label, baseline_src, requests, work / f"{label}-{round_index}")
            results[label].append(result)
            print(f"round {round_index + 1} {label:8s} {result.throughput_rps:8,.0f} req/s  "
                  f"p50 {result.p50_ms:5.2f} ms  p99 {result.p99_ms:5.2f} ms  "
                  f"errors {result.failed}", flush=True)
    medians = {label: statistics.median(r.throughput_rps for r in rs)
               for label, rs in results.items()}
    for label in ("after", "watched"):
        ratio = medians[label] / medians["before"]
        verdict = "PASS" if ratio >= GOAL_RATIO else "MISS"
        print(f"{verdict} {label}/before throughput ratio {ratio:.3f} "
              f"({medians[label]:,.0f} vs {medians['before']:,.0f} req/s; goal >= {GOAL_RATIO})")


def _measure(args: argparse.Namespace, label: str, baseline_src: Path, requests: list[bytes],
             log: Path) -> StepResult:
    port = servers.free_port()
    command = servers.serval_command(args.repository, port, 1, 0)
    previous = os.environ.pop("PYTHONPATH", None)
    if label == "before":  # the baseline's sources shadow the installed package
        os.environ["PYTHONPATH"] = str(baseline_src)
    try:
        with servers.running(command, port, "/v2/health/ready", log.with_suffix(".log")):
            stop = threading.Event()
            watcher = threading.Thread(target=_watch, args=(port, args.model, stop), daemon=True)
            if label == "watched":
                watcher.start()
            try:
                return run_closed_loop(servers.HOST, port, requests, args.concurrency,
                                       args.duration, args.warmup)
            finally:
                stop.set()
    finally:
        os.environ.pop("PYTHONPATH", None)
        if previous is not None:
            os.environ["PYTHONPATH"] = previous


def _sampler_cost(models: int, active_share: float = 0.2) -> None:
    """CPU the 1 s sampler takes with `models` versions, a fifth of them taking traffic."""
    import time

    from serval.repository.served import ModelState, ServedModel
    from serval.server.http.ui.status import ServerStatus
    from serval.stats import ModelStats

    totals = ModelStats("_all", "")
    versions = [ServedModel(f"m{i}", "1", ModelState.READY, totals=totals) for i in range(models)]

    class Registry:  # what the sampler reads of the registry
        control, root, loads, evictions, hits, misses = "lazy", Path("."), 0, 0, 0, 0
        memory_budget_bytes, resident_bytes = None, 0
        totals = ModelStats("_all", "")

        def all_models(self) -> list[ServedModel]:
            return versions

    clock = [0.0]
    status = ServerStatus(Registry(), clock=lambda: clock[0])  # type: ignore[arg-type]
    busy = versions[: max(1, int(models * active_share))]
    spent_s = 0.0
    for second in range(1, 31):
        for served in busy:
            served.stats.record_request("success", 1_000_000)
            served.stats.record_execution(1, 1, 0, 500_000, 0)
        clock[0] = float(second)
        started = time.perf_counter()
        status.sample()
        if second > 1:  # the first look creates every window: once per server, not per second
            spent_s += time.perf_counter() - started
    share = spent_s / 29
    print(f"sampler: {models:,} versions ({len(busy):,} busy): {share * 1000:.2f} ms per 1 s "
          f"sample = {share:.2%} of one core")


def _watch(port: int, model: str, stop: threading.Event) -> None:
    """What the page does: three JSON requests a second."""
    while not stop.wait(1.0):
        for path in ("/status", "/status/models?per_page=50", f"/status/models/{model}"):
            servers.get_json(port, path)


def _checkout(ref: str, into: Path) -> Path:
    """The `src` tree of a commit, extracted with git archive."""
    if ref == "auto":  # the commit before the status page first landed (at its old path)
        added = subprocess.run(
            ["git", "log", "--diff-filter=A", "--format=%H", "--",
             "src/serval/observability/status.py"], cwd=ROOT, capture_output=True, text=True,
            check=True).stdout.split()
        ref = f"{added[-1]}^"
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref, "src"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    print(f"baseline: {ref} ({into / 'src'})")
    return into / "src"


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=ROOT / "examples" / "models")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline-ref", default="auto",
                        help="git ref of the 'before' server (auto: the commit before status.py)")
    return parser.parse_args()


if __name__ == "__main__":
    main()
