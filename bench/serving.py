"""`make bench`: Serval vs a plain FastAPI server vs the in-process engine, in one run.

For each model (default mlp, lstm, minilm): throughput, p50 and p99 at several client counts,
one item per request, for (a) Serval with JSON bodies, (b) Serval with binary tensors, (c) the
FastAPI baseline users write by hand (bench/baseline_fastapi.py), and (d) the ONNX Runtime
ceiling measured in this process while no server runs. HTTP-bound models (--multi-worker-models)
are also measured with more Serval workers. The load generator's own ceiling is measured against
bench/trivial_server.py. One server runs at a time, on a free loopback port; each answer format
is checked against the engine's own output before it is measured.

Prints a table per model, the ratios this run gives, and the goals as PASS/MISS.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/serving.py --repository examples/models
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import report, servers
from bench.checks import check_answer, check_grpc_answer
from bench.engine_ceiling import Ceiling, engine_outputs, engine_session, measure_ceiling
from bench.workloads import (
    grpc_requests,
    infer_requests,
    max_batch,
    model_file,
    model_spec,
    random_feeds,
)
from serval.loadtest.closed_loop import StepResult, run_closed_loop
from serval.loadtest.grpc_closed_loop import run_grpc_closed_loop
from serval.loadtest.http_client import encode_http_request

REQUESTS_PER_MODE = 16  # distinct pre-encoded bodies per model and mode
console = Console(width=150)


def main() -> None:
    args = _parse_args()
    logs = Path(tempfile.mkdtemp(prefix="serval-bench-"))
    trivial = _generator_ceiling(args, logs)
    rows_by_model: dict[str, report.Rows] = {}
    lines: list[str] = []
    goals: list[str] = []
    out: dict[str, Any] = {"generator_ceiling": report.result_dict(trivial), "models": {}}
    for model in args.models:
        ceiling = measure_ceiling(model_file(args.repository, model),
                                  max_batch(args.repository, model), args.engine_seconds)
        console.print(f"[bold]{model}[/]: engine ceiling {ceiling.best_items_per_s:,.0f} items/s "
                      f"(batch {ceiling.best_batch}), batch-1 {ceiling.batch1_ms:.3f} ms")
        rows = rows_by_model[model] = _measure_model(args, model, logs)
        report.print_table(console, model, rows, ceiling)
        primary = f"w{args.workers}"
        lines += report.ratio_lines(model, rows, ceiling, primary)
        goals += report.goal_lines(model, rows, ceiling, primary)
        goals += report.grpc_goal_lines(model, rows, primary)
        out["models"][model] = _model_json(rows, ceiling)
    lines.append(report.generator_line(trivial, rows_by_model))
    _print_summary(lines, goals, logs)
    if args.json_out:
        out["ratios"], out["goals"] = lines, goals
        args.json_out.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2
                                               | orjson.OPT_NON_STR_KEYS))


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--models", type=_names, default=["mlp", "lstm", "minilm"])
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 16, 64, 256], help="client counts, e.g. 1,16,64,256")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds per step")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per step")
    parser.add_argument("--workers", type=int, default=1, help="Serval --workers")
    parser.add_argument("--multi-worker-models", type=_names, default=["mlp"],
                        help="models also measured with --multi-workers Serval workers")
    parser.add_argument("--multi-workers", type=int, default=2)
    parser.add_argument("--processes", type=int, default=0,
                        help="load generator processes (0: 1 on <= 2 cores or <= 16 clients, "
                             "else 2)")
    parser.add_argument("--engine-seconds", type=float, default=3.0,
                        help="seconds per batch size for the engine ceiling")
    parser.add_argument("--json-out", type=Path, default=None)
    return parser.parse_args()


def _names(text: str) -> list[str]:
    return [name for name in text.split(",") if name]


def _processes(args: argparse.Namespace, concurrency: int) -> int:
    """Generator processes: one process outruns two wherever it shares two cores with a server."""
    if args.processes > 0:
        return int(args.processes)
    return 1 if concurrency <= 16 or (os.cpu_count() or 1) <= 2 else 2


def _generator_ceiling(args: argparse.Namespace, logs: Path) -> StepResult:
    port = servers.free_port()
    request = [encode_http_request("GET", "/", host=servers.HOST)]
    with servers.running(servers.trivial_command(port), port, "/", logs / "trivial.log"):
        result = run_closed_loop(servers.HOST, port, request, 64, args.duration, args.warmup,
                                 _processes(args, 64))
    console.print(f"load generator ceiling (trivial endpoint, 64 clients, "
                  f"{_processes(args, 64)} process(es)): {result.throughput_rps:,.0f} req/s, "
                  f"p50 {result.p50_ms:.2f} ms, errors {result.failed}")
    return result


def _measure_model(args: argparse.Namespace, model: str, logs: Path) -> report.Rows:
    """Serval (JSON and binary, per worker count), then the FastAPI baseline: one at a time."""
    onnx_file = model_file(args.repository, model)
    alone = servers.only(args.repository, [model], logs)
    spec = model_spec(onnx_file)
    feeds = random_feeds(spec, batch=1, count=REQUESTS_PER_MODE, seed=0)
    expected = engine_outputs(engine_session(onnx_file), feeds[0])
    rows: report.Rows = {}
    worker_counts = [args.workers]
    if model in args.multi_worker_models and args.multi_workers != args.workers:
        worker_counts.append(args.multi_workers)
    for workers in worker_counts:
        port, grpc_port = servers.free_ports(2)
        command = servers.serval_command(alone, port, workers, grpc_port)
        with servers.running(command, port, "/v2/health/ready",
                             logs / f"serval-{model}-w{workers}.log"):
            servers.get_json(port, f"/v2/models/{model}")  # the model is there and loaded
            for binary in (False, True):
                label = f"serval {'binary' if binary else 'json'} w{workers}"
                requests = infer_requests(model, feeds, binary, servers.HOST)
                check_answer(servers.HOST, port, requests[0], spec, expected, label)
                rows[label] = _sweep(args, port, requests, label)
            target = f"{servers.HOST}:{grpc_port}"
            grpc_reqs = grpc_requests(model, feeds)
            check_grpc_answer(target, grpc_reqs[0], spec, expected, f"serval grpc w{workers}")
            for mode in ("unary", "stream"):
                label = f"serval grpc-{mode} w{workers}"
                rows[label] = _grpc_sweep(args, target, grpc_reqs, mode, label)
    port = servers.free_port()
    with servers.running(servers.fastapi_command(alone, port), port,
                         "/v2/health/ready", logs / f"fastapi-{model}.log"):
        requests = infer_requests(model, feeds, False, servers.HOST)
        check_answer(servers.HOST, port, requests[0], spec, expected, "fastapi json")
        rows["fastapi json"] = _sweep(args, port, requests, "fastapi json")
    return rows


def _grpc_sweep(args: argparse.Namespace, target: str, requests: list[bytes], mode: str,
                label: str) -> dict[int, StepResult]:
    results = {}
    for concurrency in args.concurrency:
        result = run_grpc_closed_loop(target, requests, concurrency, args.duration, args.warmup,
                                      processes=1, mode=mode)
        results[concurrency] = result
        _print_step(label, concurrency, result)
    return results


def _print_step(label: str, concurrency: int, result: StepResult) -> None:
    console.print(f"  {label:22} c={concurrency:<4} {result.throughput_rps:9,.0f} req/s  "
                  f"p50 {result.p50_ms:7.2f}  p99 {result.p99_ms:7.2f} ms  "
                  f"errors {result.errors or 0}")


def _sweep(args: argparse.Namespace, port: int, requests: list[bytes], label: str
           ) -> dict[int, StepResult]:
    results = {}
    for concurrency in args.concurrency:
        result = run_closed_loop(servers.HOST, port, requests, concurrency, args.duration,
                                 args.warmup, _processes(args, concurrency))
        results[concurrency] = result
        _print_step(label, concurrency, result)
    return results


def _model_json(rows: report.Rows, ceiling: Ceiling) -> dict[str, Any]:
    return {"ceiling": vars(ceiling),
            "rows": {label: {c: report.result_dict(r) for c, r in by.items()}
                     for label, by in rows.items()}}


def _print_summary(lines: list[str], goals: list[str], logs: Path) -> None:
    console.rule("ratios (this run)")
    for line in lines:
        console.print(line, highlight=False)
    console.rule("goals")
    for line in goals:
        style = "green" if line.startswith("PASS") else "red"
        console.print(f"[{style}]{line[:4]}[/]{line[4:]}", highlight=False)
    console.print(f"server logs: {logs}", highlight=False)


if __name__ == "__main__":
    main()
