"""Step 6: the report as JSON (stored in the published version's manifest) and Markdown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


def write(report: dict[str, Any], folder: Path) -> tuple[Path, Path]:
    """Write report.json and report.md into folder."""
    json_path, md_path = folder / "report.json", folder / "report.md"
    json_path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    md_path.write_text(markdown(report), encoding="utf-8")
    return json_path, md_path


def markdown(report: dict[str, Any]) -> str:
    """A human-readable page: steps, parity verdict and figures, before/after costs."""
    parity = report["parity"]
    lines = [f"# serval optimize: {report['source']}", "",
             f"- Steps: {', '.join(s['step'] for s in report['steps'])}",
             f"- Parity: **{'PASSED' if parity['passed'] else 'FAILED'}** on "
             f"{parity['inputs']['items']} items ({parity['inputs']['kind']}) against "
             f"{parity['reference']}"]
    lines += [f"  - {failure}" for failure in parity["failures"]]
    lines += ["", "## Steps", "", "| step | details |", "|---|---|"]
    lines += [f"| {s['step']} | {_details(s)} |" for s in report["steps"]]
    for step in report["steps"]:
        if step.get("search"):
            lines += ["", "## INT8 recipes tried (fastest passing chosen)", "",
                      "| recipe | nodes kept FP32 | mean cos | worst cos | items/s, batch 32 "
                      "| parity |", "|---|---|---|---|---|---|"]
            lines += [f"| {t['recipe']} | {t['kept_fp32']} | {_fmt(t['mean_cosine'], '.4f')} | "
                      f"{_fmt(t['worst_cosine'], '.4f')} | {_fmt(t['items_per_s'], ',.0f')} | "
                      f"{'pass' if t['passed'] else 'fail'} |" for t in step["search"]]
    lines += ["", "## Parity", "",
              "| output | items | max abs | max rel | mean cos | min cos | top-1 | sum err "
              "| NaN/Inf |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [_parity_row(o) for o in parity["outputs"]]
    lines += ["", "## Cost (this machine, in process)", "", *_cost_table(report["measure"])]
    return "\n".join(lines) + "\n"


def _details(step: dict[str, Any]) -> str:
    shown = {k: v for k, v in step.items()
             if k not in ("step", "search") and v not in ({}, [], (), "")}
    return ", ".join(f"{k}: {_short(v)}" for k, v in shown.items())


def _short(value: Any) -> Any:
    """Long node lists as a count (report.json keeps every name)."""
    return f"{len(value)} nodes" if isinstance(value, list | tuple) and len(value) > 3 else value


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _parity_row(o: dict[str, Any]) -> str:
    return (f"| {o['name']} | {o['items']} | {_fmt(o['max_abs_error'], '.3g')} | "
            f"{_fmt(o['max_relative_error'], '.3g')} | {_fmt(o['mean_cosine'], '.5f')} | "
            f"{_fmt(o['min_cosine'], '.5f')} | {_fmt(o['top1_agreement'], '.2%')} | "
            f"{_fmt(o['max_softmax_sum_error'], '.2g')} | {o['nan_or_inf']} |")


def _cost_table(measure: dict[str, Any]) -> list[str]:
    if not measure:
        return ["(not measured)"]
    before, after = measure["before"], measure["after"]
    rows = [("size (MB)", "size_bytes", 1e-6, ".1f"),
            ("latency p50, batch 1 (ms)", "latency_p50_ms", 1.0, ".2f"),
            ("throughput, batch 32 (items/s)", "throughput_items_per_s", 1.0, ",.0f")]
    lines = [f"Threads: {after['threads']}; sessions at graph_optimization_level="
             f"{after['graph_optimization_level']}.", "",
             "| | before | after | after/before |", "|---|---|---|---|"]
    for label, key, scale, spec in rows:
        ratio = after[key] / before[key] if before[key] else float("nan")
        lines.append(f"| {label} | {format(before[key] * scale, spec)} | "
                     f"{format(after[key] * scale, spec)} | {ratio:.2f} |")
    return lines
