"""Tables, ratios and goal checks for bench/serving.py: everything it prints about the results.

Rows are keyed by label ("serval json w1", "serval binary w2", "fastapi json") and then by the
number of concurrent clients. Every ratio compares figures taken in the same run.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.engine_ceiling import Ceiling
from serval.loadtest.closed_loop import StepResult

Rows = dict[str, dict[int, StepResult]]  # label -> concurrency -> result

GOAL_SHARE_OF_CEILING = {"lstm": 0.80, "minilm": 0.95}
MLP_JSON_RPS, MLP_JSON_P99_MS = 8000.0, 20.0
ADDED_LATENCY_MS = 0.5


def print_table(console: Console, model: str, rows: Rows, ceiling: Ceiling) -> None:
    """One row per server/mode and client count: req/s, p50, p99, failures, share of ceiling."""
    console.print(f"[bold]{model}[/]: one item per request; engine ceiling "
                  f"{ceiling.best_items_per_s:,.0f} items/s (batch {ceiling.best_batch}), "
                  f"batch-1 latency {ceiling.batch1_ms:.3f} ms", highlight=False)
    table = Table()
    table.add_column("server / mode")
    for column in ("clients", "req/s", "p50 ms", "p99 ms", "errors", "of ceiling"):
        table.add_column(column, justify="right")
    for label, by_concurrency in rows.items():
        for concurrency, r in by_concurrency.items():
            table.add_row(label, str(concurrency), f"{r.throughput_rps:,.0f}", f"{r.p50_ms:.2f}",
                          f"{r.p99_ms:.2f}", _errors_text(r),
                          f"{r.throughput_rps / ceiling.best_items_per_s:.0%}")
    console.print(table)


def _errors_text(result: StepResult) -> str:
    if not result.errors:
        return "0"
    return ", ".join(f"{kind} {count}" for kind, count in result.errors.items())


def ratio_lines(model: str, rows: Rows, ceiling: Ceiling, primary: str) -> list[str]:
    """What one run shows: Serval vs FastAPI, binary vs JSON, share of ceiling, added latency."""
    lines = []
    if _has(rows, 64, f"serval json {primary}", "fastapi json"):
        json64, fastapi64 = rows[f"serval json {primary}"][64], rows["fastapi json"][64]
        text = f"{model} @64: Serval JSON = {_x(json64, fastapi64):.1f}x FastAPI"
        if _has(rows, 64, f"serval binary {primary}"):
            binary64 = rows[f"serval binary {primary}"][64]
            text += f"; Serval binary / JSON = {_x(binary64, json64):.2f}"
        label, best = best_serval(rows, 64)
        text += (f"; best Serval ({label}) = {best.throughput_rps / ceiling.best_items_per_s:.2f}"
                 f" of engine ceiling")
        lines.append(text)
    if _has(rows, 1, f"serval json {primary}"):
        parts = [f"{mode} {rows[f'serval {mode} {primary}'][1].p50_ms - ceiling.batch1_ms:+.2f} ms"
                 for mode in ("json", "binary") if _has(rows, 1, f"serval {mode} {primary}")]
        lines.append(f"{model} 1 client: Serval p50 - engine batch-1 latency "
                     f"({ceiling.batch1_ms:.3f} ms) = {', '.join(parts)}")
    if any(256 in by for by in rows.values()):
        failed = {label: by[256].failed for label, by in rows.items() if 256 in by}
        lines.append(f"{model} @256: failed requests "
                     + ", ".join(f"{label} {count}" for label, count in failed.items()))
    return lines


def goal_lines(model: str, rows: Rows, ceiling: Ceiling, primary: str) -> list[str]:
    """The issue's goals for this model, each PASS or MISS with the figures behind it."""
    lines = []
    if model == "mlp" and _has(rows, 64, f"serval json {primary}"):
        label, json64 = best_serval(rows, 64, "serval json")
        lines.append(_goal(json64.throughput_rps >= MLP_JSON_RPS
                           and json64.p99_ms <= MLP_JSON_P99_MS,
                           f"mlp JSON >= {MLP_JSON_RPS:,.0f} req/s @64 with p99 <= "
                           f"{MLP_JSON_P99_MS:.0f} ms ({label}: {json64.throughput_rps:,.0f} "
                           f"req/s, p99 {json64.p99_ms:.1f} ms)"))
        if _has(rows, 64, f"serval binary {primary}"):
            binary64 = rows[f"serval binary {primary}"][64]
            json_p = rows[f"serval json {primary}"][64]
            lines.append(_goal(binary64.throughput_rps >= json_p.throughput_rps,
                               f"mlp binary >= JSON @64 ({primary}: "
                               f"{binary64.throughput_rps:,.0f} vs {json_p.throughput_rps:,.0f} "
                               f"req/s)"))
    share = GOAL_SHARE_OF_CEILING.get(model)
    if share is not None and any(64 in by for label, by in rows.items() if label[:6] == "serval"):
        label, best = best_serval(rows, 64)
        got = best.throughput_rps / ceiling.best_items_per_s
        lines.append(_goal(got >= share, f"{model} >= {share:.0%} of the engine ceiling @64 "
                                         f"({label}: {got:.0%})"))
    if _has(rows, 1, f"serval json {primary}"):
        added = rows[f"serval json {primary}"][1].p50_ms - ceiling.batch1_ms
        lines.append(_goal(added <= ADDED_LATENCY_MS,
                           f"{model} 1-client p50 within {ADDED_LATENCY_MS} ms of engine batch-1 "
                           f"latency (JSON {primary}: {added:+.2f} ms)"))
    serval256 = [by[256] for label, by in rows.items() if label[:6] == "serval" and 256 in by]
    if serval256:
        failed = sum(r.failed for r in serval256)
        lines.append(_goal(failed == 0, f"{model}: zero failed Serval requests @256 ({failed})"))
    return lines


def grpc_goal_lines(model: str, rows: Rows, primary: str) -> list[str]:
    """The gRPC front end's goals: >= HTTP binary on every model, >= 2x HTTP JSON on mlp."""
    labels = [f"serval grpc-{mode} {primary}" for mode in ("unary", "stream")]
    if not _has(rows, 64, f"serval binary {primary}", *labels):
        return []
    binary = rows[f"serval binary {primary}"][64].throughput_rps
    json = rows[f"serval json {primary}"][64].throughput_rps
    lines = []
    for label in labels:
        grpc_rps = rows[label][64].throughput_rps
        lines.append(_goal(grpc_rps >= binary, f"{model} {label} >= HTTP binary @64 "
                                               f"({grpc_rps:,.0f} vs {binary:,.0f} req/s)"))
        if model == "mlp":
            lines.append(_goal(grpc_rps >= 2 * json, f"mlp {label} >= 2x HTTP JSON @64 "
                                                     f"({grpc_rps / json:.2f}x)"))
    return lines


def generator_line(trivial: StepResult, rows_by_model: dict[str, Rows]) -> str:
    """The generator's ceiling, and how close the fastest measured server came to it."""
    fastest = max((r.throughput_rps for rows in rows_by_model.values() for by in rows.values()
                   for r in by.values()), default=0.0)
    return (f"load generator ceiling (trivial endpoint, 64 clients): "
            f"{trivial.throughput_rps:,.0f} req/s, p50 {trivial.p50_ms:.2f} ms; fastest server "
            f"measured = {fastest / max(trivial.throughput_rps, 1.0):.0%} of it")


def best_serval(rows: Rows, concurrency: int, prefix: str = "serval") -> tuple[str, StepResult]:
    candidates = [(label, by[concurrency]) for label, by in rows.items()
                  if label.startswith(prefix) and concurrency in by]
    return max(candidates, key=lambda item: item[1].throughput_rps)


def result_dict(result: StepResult) -> dict[str, Any]:
    """A StepResult for --json-out: figures only, the sample answer cut short."""
    data = asdict(result)
    data.pop("sample_bodies", None)
    data["sample_body"] = result.sample_body[:200].decode("utf-8", errors="replace")
    return data


def _has(rows: Rows, concurrency: int, *labels: str) -> bool:
    return all(concurrency in rows.get(label, {}) for label in labels)


def _x(a: StepResult, b: StepResult) -> float:
    return a.throughput_rps / b.throughput_rps if b.throughput_rps else float("inf")


def _goal(passed: bool, text: str) -> str:
    return f"{'PASS' if passed else 'MISS'}  {text}"
