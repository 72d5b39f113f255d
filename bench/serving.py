"""`make bench`: Serval vs a plain FastAPI server vs the in-process engine, in one run.

For each example model: throughput and latency at several client counts, one item per request,
for Serval (JSON and binary tensors; 1 worker, and 2 workers for HTTP-bound models), the FastAPI
baseline users write by hand, and the ONNX Runtime ceiling measured in this process. Prints a
table per model, ratios measured in this run, and the issue's goals as PASS/MISS.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import orjson
import yaml
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers
from bench.engine_ceiling import Ceiling, measure_ceiling
from bench.workloads import infer_requests
from serval.loadtest.closed_loop import (
    StepResult,
    encode_http_request,
    run_closed_loop,
)

console = Console(width=140)
Rows = dict[str, dict[int, StepResult]]  # label -> concurrency -> result


def main() -> None:
    args = _parse_args()
    logs = Path(tempfile.mkdtemp(prefix="serval-bench-"))
    report: dict[str, object] = {"generator_ceiling": asdict(_generator_ceiling(args, logs))}
    for model in args.models:
        ceiling = measure_ceiling(args.repository / model / "1" / "model.onnx",
                                  _max_batch(args.repository, model))
        rows = _measure_servers(args, model, logs)
        _print_table(model, rows, ceiling)
        report[model] = {"ceiling": asdict(ceiling),
                         "rows": {label: {c: asdict(r) for c, r in by.items()}
                                  for label, by in rows.items()}}
        report[model + "_goals"] = _check_goals(model, rows, ceiling, args.concurrency)
    if args.json_out:
        args.json_out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2,
                                               default=lambda b: b.decode(errors="replace")))
    console.print(f"server logs: {logs}")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--models", type=lambda s: s.split(","), default=["mlp", "lstm", "minilm"])
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 16, 64, 256])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--multi-worker-models", type=lambda s: s.split(","), default=["mlp"],
                        help="HTTP-bound models also measured with --workers 2")
    parser.add_argument("--processes", type=int, default=1, help="load generator processes")
    parser.add_argument("--json-out", type=Path, default=None)
    return parser.parse_args()


def _generator_ceiling(args: argparse.Namespace, logs: Path) -> StepResult:
    port = servers.free_port()
    request = [encode_http_request("GET", "/", b"", {}, servers.HOST)]
    with servers.running(servers.trivial_command(port), port, "/", logs / "trivial.log"):
        result = run_closed_loop(servers.HOST, port, request, 64, args.duration, args.warmup,
                                 args.processes)
    console.print(f"load generator ceiling (trivial endpoint, 64 clients): "
                  f"{result.throughput_rps:,.0f} req/s, p50 {result.p50_ms:.2f} ms")
    return result


def _measure_servers(args: argparse.Namespace, model: str, logs: Path) -> Rows:
    rows: Rows = {}
    worker_counts = [1, 2] if model in args.multi_worker_models else [1]
    for workers in worker_counts:
        port = servers.free_port()
        command = servers.serval_command(args.repository, port, workers)
        log = logs / f"serval-{model}-w{workers}.log"
        with servers.running(command, port, "/v2/health/ready", log):
            metadata = servers.get_json(port, f"/v2/models/{model}")
            for binary in (False, True):
                label = f"serval {'binary' if binary else 'json'} w{workers}"
                requests = infer_requests(model, metadata, binary, 16, servers.HOST)
                rows[label] = _sweep(args, port, requests, label)
    port = servers.free_port()
    with servers.running(servers.fastapi_command(args.repository, port), port,
                         "/v2/health/ready", logs / f"fastapi-{model}.log"):
        metadata = {"inputs": _inputs_from_config(args.repository, model)}
        requests = infer_requests(model, metadata, False, 16, servers.HOST)
        rows["fastapi json"] = _sweep(args, port, requests, "fastapi json")
    return rows


def _sweep(args: argparse.Namespace, port: int, requests: list[bytes], label: str
           ) -> dict[int, StepResult]:
    results = {}
    for concurrency in args.concurrency:
        result = run_closed_loop(servers.HOST, port, requests, concurrency, args.duration,
                                 args.warmup, args.processes)
        _sanity_check(result, label)
        results[concurrency] = result
        console.print(f"  {label:20} c={concurrency:<4} {result.throughput_rps:9,.0f} req/s  "
                      f"p50 {result.p50_ms:7.2f}  p99 {result.p99_ms:7.2f} ms  "
                      f"errors {result.errors or 0}")
    return results


def _sanity_check(result: StepResult, label: str) -> None:
    if b'"outputs"' not in result.sample_body:
        raise SystemExit(f"{label}: bad response: {result.sample_body[:300]!r}")


def _inputs_from_config(repository: Path, model: str) -> list[dict[str, object]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(repository / model / "1" / "model.onnx"))
    types = {"tensor(float)": "FP32", "tensor(int64)": "INT64"}
    return [{"name": a.name, "datatype": types[a.type],
             "shape": [-1, *(d for d in a.shape[1:])]} for a in session.get_inputs()]


def _max_batch(repository: Path, model: str) -> int:
    config = yaml.safe_load((repository / model / "config.yaml").read_text()) or {}
    return int(config.get("max_batch_size", 64))


def _print_table(model: str, rows: Rows, ceiling: Ceiling) -> None:
    table = Table(title=f"{model}: one item per request (engine ceiling "
                        f"{ceiling.best_items_per_s:,.0f} items/s at batch {ceiling.best_batch}; "
                        f"batch-1 latency {ceiling.batch1_ms:.3f} ms)")
    for column in ("server", "clients", "req/s", "p50 ms", "p99 ms", "failed", "of ceiling"):
        table.add_column(column, justify="right" if column != "server" else "left")
    for label, by_concurrency in rows.items():
        for concurrency, r in by_concurrency.items():
            table.add_row(label, str(concurrency), f"{r.throughput_rps:,.0f}", f"{r.p50_ms:.2f}",
                          f"{r.p99_ms:.2f}", str(r.failed),
                          f"{r.throughput_rps / ceiling.best_items_per_s:.0%}")
    console.print(table)


def _best(rows: Rows, concurrency: int, prefix: str) -> tuple[str, StepResult]:
    candidates = [(label, by[concurrency]) for label, by in rows.items()
                  if label.startswith(prefix) and concurrency in by]
    return max(candidates, key=lambda item: item[1].throughput_rps)


def _check_goals(model: str, rows: Rows, ceiling: Ceiling, levels: list[int]) -> list[str]:
    lines: list[str] = []
    if 64 in levels:
        lines += _goals_at_64(model, rows, ceiling)
    if 1 in levels:
        one = min((by[1] for label, by in rows.items() if label.startswith("serval") and 1 in by),
                  key=lambda r: r.p50_ms)
        added = one.p50_ms - ceiling.batch1_ms
        lines.append(_goal(added <= 0.5, f"{model} 1 client: p50 {one.p50_ms:.3f} ms = engine "
                                          f"batch-1 {ceiling.batch1_ms:.3f} ms + {added:.3f} ms"))
    if 256 in levels:
        failed = sum(by[256].failed for label, by in rows.items()
                     if label.startswith("serval") and 256 in by)
        lines.append(_goal(failed == 0, f"{model} 256 clients: {failed} failed Serval requests"))
    for line in lines:
        console.print(line)
    return lines


def _goals_at_64(model: str, rows: Rows, ceiling: Ceiling) -> list[str]:
    json_label, json64 = _best(rows, 64, "serval json")
    _, binary64 = _best(rows, 64, "serval binary")
    fastapi64 = rows["fastapi json"][64]
    best64 = max(json64, binary64, key=lambda r: r.throughput_rps)
    of_ceiling = best64.throughput_rps / ceiling.best_items_per_s
    lines = [f"ratio {model} @64: {json_label} = "
             f"{json64.throughput_rps / fastapi64.throughput_rps:.1f}x FastAPI; binary/JSON = "
             f"{binary64.throughput_rps / json64.throughput_rps:.2f}; best Serval = "
             f"{of_ceiling:.0%} of the engine ceiling"]
    if model == "mlp":
        lines.append(_goal(json64.throughput_rps >= 8000 and json64.p99_ms <= 20,
                           f"mlp JSON >= 8,000 req/s @64, p99 <= 20 ms ({json_label}: "
                           f"{json64.throughput_rps:,.0f} req/s, p99 {json64.p99_ms:.1f} ms)"))
        lines.append(_goal(binary64.throughput_rps >= json64.throughput_rps,
                           f"mlp binary >= JSON ({binary64.throughput_rps:,.0f} vs "
                           f"{json64.throughput_rps:,.0f} req/s)"))
    share = {"lstm": 0.80, "minilm": 0.95}.get(model)
    if share is not None:
        lines.append(_goal(of_ceiling >= share,
                           f"{model} >= {share:.0%} of the engine ceiling @64 ({of_ceiling:.0%})"))
    return lines


def _goal(passed: bool, text: str) -> str:
    return f"{'PASS' if passed else 'MISS'}  {text}"


if __name__ == "__main__":
    main()
