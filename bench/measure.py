"""Measure and decide on this machine: loadtest the example models, report, plan.

Serves mlp and lstm, measures the generator's own ceiling, sweeps each model closed-loop,
checks an open-loop rate and the generator's counts against the server's statistics, then writes
the report (HTML + PNG) and the cost plan (table + chart) into bench/results/measure/.
Prints PASS/MISS against the goals of `serval loadtest`, measured in this one run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers
from serval.cli.loadtest import results_table
from serval.loadtest.ceiling import measure_ceiling
from serval.loadtest.runner import LoadtestSpec, run_loadtest

console = Console(width=130)
HARDWARE = "c6a.large"  # the catalog's nearest match to this machine: 2 vCPU, AMD Zen 3


def main() -> None:
    args = _parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    ceiling_rps = measure_ceiling(duration_s=args.duration)
    console.print(f"generator ceiling: {ceiling_rps:,.0f} req/s (trivial endpoint, 64 clients)")
    goals: list[str] = []
    files = []
    with tempfile.TemporaryDirectory() as tmp:
        repository = servers.only(args.repository, args.models, Path(tmp))
        port, grpc_port = servers.free_ports(2)
        command = servers.serval_command(repository, port, 1, grpc_port)
        with servers.running(command, port, "/v2/health/ready", Path(tmp) / "serval.log"):
            for model in args.models:
                results = _measure(args, port, model, ceiling_rps, goals)
                path = args.out / f"{model}.json"
                path.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
                files.append(path)
    best_mlp = max((s["throughput_rps"] for s in orjson.loads(
        (args.out / "mlp.json").read_bytes())["steps"]), default=0.0) if "mlp" in args.models \
        else 0.0
    if best_mlp:
        ratio = ceiling_rps / best_mlp
        goals.append(f"{'PASS' if ratio >= 3 else 'MISS'} generator ceiling {ceiling_rps:,.0f} "
                     f"req/s = {ratio:.1f}x Serval's best mlp {best_mlp:,.0f} req/s (goal >= 3x)")
    _serval("report", *map(str, files), "-o", str(args.out / "report.html"))
    _serval("plan", *map(str, files), "--slo-p99-ms", str(args.slo_p99_ms),
            "--target-rps", "1000", "--chart", str(args.out / "plan.png"))
    console.rule("goals")
    for line in goals:
        console.print(line)
    console.print(f"report: {args.out / 'report.html'} and {args.out / 'report.png'}")


def _measure(args: argparse.Namespace, port: int, model: str, ceiling_rps: float,
             goals: list[str]) -> dict[str, Any]:
    url = f"http://{servers.HOST}:{port}"
    before = _successes(port, model)
    spec = LoadtestSpec(url=url, model=model, concurrency=tuple(args.concurrency),
                        duration_s=args.duration, warmup_s=args.warmup, hardware=HARDWARE,
                        label=f"{model} on this machine ({HARDWARE})")
    results = run_loadtest(spec, ceiling_rps)
    best = max(s["throughput_rps"] for s in results["steps"])
    rate = round(best * args.rate_share, -1)
    open_spec = LoadtestSpec(url=url, model=model, rates_rps=(rate,), duration_s=args.duration,
                             warmup_s=args.warmup, hardware=HARDWARE)
    results["steps"] += run_loadtest(open_spec, ceiling_rps)["steps"]
    console.print(results_table(results))
    answered = sum(s["answered"] for s in results["steps"])
    counted = _successes(port, model) - before
    goals.append(f"{'PASS' if answered == counted else 'MISS'} {model}: generator counted "
                 f"{answered:,} answers, server statistics {counted:,}")
    achieved = results["steps"][-1]["throughput_rps"]
    goals.append(f"{'PASS' if abs(achieved / rate - 1) <= 0.02 else 'MISS'} {model}: "
                 f"--rate {rate:g} achieved {achieved:,.1f} req/s ({achieved / rate:.2%}; "
                 f"goal within 2%, p99 {results['steps'][-1]['p99_ms']:.2f} ms)")
    return results


def _successes(port: int, model: str) -> int:
    stats = servers.get_json(port, f"/v2/models/{model}/stats")["model_stats"][0]
    return int(stats["inference_stats"]["success"]["count"])


def _serval(*args: str) -> None:
    run = subprocess.run([sys.executable, "-m", "serval", *args], capture_output=True,
                         text=True)
    console.print(run.stdout.rstrip())
    if run.returncode != 0:
        raise SystemExit(f"serval {args[0]} failed: {run.stderr.strip()}")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--models", nargs="+", default=["mlp", "lstm"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rate-share", type=float, default=0.5,
                        help="open-loop rate as a share of the best closed-loop throughput")
    parser.add_argument("--slo-p99-ms", type=float, default=50.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/measure"))
    return parser.parse_args()


if __name__ == "__main__":
    main()
