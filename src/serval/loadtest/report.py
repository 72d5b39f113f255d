"""Static reports of load-test results: latency-vs-throughput curves, latency CDFs, tables.

Several results files overlay in one figure (CPU vs GPU, FP32 vs INT8, Serval vs another
server). The PNG is drawn with matplotlib (the `report` extra, imported lazily); the HTML page
embeds it as a data URI, so both files read offline.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

MISSING_EXTRA = "serval report needs matplotlib: pip install 'serval-server[report]'"


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError(MISSING_EXTRA) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure(runs: list[dict[str, Any]]) -> Any:
    """Left: p99 (solid) and p50 (dashed) against throughput over the closed-loop steps, and
    the open-loop steps' p99 as crosses, per run. Right: latency CDFs.

    One run: a CDF per step. Several runs: each run's CDF at its highest-throughput step.
    """
    plt = _pyplot()
    fig, (curves, cdfs) = plt.subplots(1, 2, figsize=(13, 5.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, run in enumerate(runs):
        color = colors[index % len(colors)]
        steps = sorted(run["steps"], key=lambda s: s["throughput_rps"])
        closed = [s for s in steps if s["mode"] == "closed"]
        opened = [s for s in steps if s["mode"] == "open"]
        if closed:
            x = [s["throughput_rps"] for s in closed]
            curves.plot(x, [s["p99_ms"] for s in closed], "o-", color=color,
                        label=f"{run['label']} p99")
            curves.plot(x, [s["p50_ms"] for s in closed], "s--", color=color, alpha=0.6,
                        label=f"{run['label']} p50")
        if opened:
            curves.plot([s["throughput_rps"] for s in opened], [s["p99_ms"] for s in opened],
                        "x", color=color, markersize=9, label=f"{run['label']} p99, fixed rate")
        for step in _cdf_steps(run, len(runs)):
            pairs = step["cdf_ms"]
            cdfs.plot([p[1] for p in pairs], [p[0] for p in pairs],
                      color=color if len(runs) > 1 else None,
                      label=f"{run['label']} {step_label(step)}")
    curves.set(xlabel="throughput (req/s)", ylabel="latency (ms)",
               title="latency vs throughput", yscale="log")
    cdfs.set(xlabel="latency (ms)", ylabel="percentile", title="latency CDF", xscale="log")
    for axes in (curves, cdfs):
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _cdf_steps(run: dict[str, Any], runs: int) -> list[dict[str, Any]]:
    steps = [s for s in run["steps"] if s.get("cdf_ms")]
    if runs == 1 or not steps:
        return steps
    return [max(steps, key=lambda s: s["throughput_rps"])]


def step_label(step: dict[str, Any]) -> str:
    """'c=16' for a closed-loop step, '200/s' for an open-loop one."""
    if step["mode"] == "closed":
        return f"c={step['concurrency']}"
    return f"{step['offered_rps']:g}/s"


def png_bytes(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def write_report(runs: list[dict[str, Any]], html_path: Path | None,
                 png_path: Path | None) -> Any:
    """Write the PNG and/or the HTML page (the PNG embedded); returns the figure."""
    fig = figure(runs)
    png = png_bytes(fig)
    if png_path is not None:
        png_path.write_bytes(png)
    if html_path is not None:
        html_path.write_text(html_page(runs, png), encoding="utf-8")
    _pyplot().close(fig)
    return fig


def html_page(runs: list[dict[str, Any]], png: bytes) -> str:
    """A self-contained page: the figure, then one table per run."""
    image = base64.b64encode(png).decode("ascii")
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Serval load test"
             "</title><style>body{font-family:sans-serif;margin:2em}table{border-collapse:"
             "collapse;margin-bottom:2em}td,th{border:1px solid #ccc;padding:4px 8px;"
             "text-align:right}th{background:#eee}</style></head><body>",
             "<h1>Serval load test</h1>",
             f"<img alt='latency vs throughput and latency CDFs' "
             f"src='data:image/png;base64,{image}'>"]
    parts += [_run_table(run) for run in runs]
    parts.append("</body></html>")
    return "\n".join(parts)


def _run_table(run: dict[str, Any]) -> str:
    def esc(value: Any) -> str:
        return html.escape(str(value))

    ceiling = run.get("generator_ceiling_rps")
    head = (f"<h2>{esc(run['label'])}</h2><p>model <b>{esc(run['model'])}</b> at "
            f"{esc(run['url'])} over {esc(run['protocol'])}; hardware "
            f"{esc(run.get('hardware') or 'untagged')}; {esc(run['duration_s'])} s per step "
            f"after {esc(run['warmup_s'])} s warm-up; {esc(run['created'])}"
            + (f"; generator ceiling {ceiling:,.0f} req/s" if ceiling else "") + "</p>")
    columns = ("load", "requests", "req/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "errors")
    rows = ["<tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"]
    for s in run["steps"]:
        errors = ", ".join(f"{k} {v}" for k, v in s["errors"].items()) or "0"
        cells = (step_label(s), f"{s['requests']:,}", f"{s['throughput_rps']:,.1f}",
                 f"{s['p50_ms']:.2f}", f"{s['p90_ms']:.2f}", f"{s['p99_ms']:.2f}",
                 f"{s['p999_ms']:.2f}", errors)
        rows.append("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>")
    return head + "<table>" + "".join(rows) + "</table>"
