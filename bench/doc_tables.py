"""The benchmark tables of the README and docs/, rendered from the benchmarks' own JSON output.

A page holds a generated table between two markers:

    <!-- generated: NAME (docs/results/FILE.json); edit the renderer, not the table -->
    | ... |
    <!-- end generated -->

`docs/results/FILE.json` is what the benchmark wrote with `--json-out` (committed, so the
figures a page quotes can be traced to one run), and RENDERERS[NAME] turns it into the table.
`python bench/doc_tables.py` rewrites every marked region; `--check` only reports those that
differ (the test suite runs it, so a hand-edited figure fails).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REGION = re.compile(r"(?P<open><!-- generated: (?P<name>[a-z0-9-]+) \(docs/results/(?P<file>"
                    r"[a-z0-9-]+)\.json\); edit the renderer, not the table -->\n)(?P<body>.*?)"
                    r"(?P<close><!-- end generated -->)", re.S)


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def engine_bound(results: dict[str, Any]) -> str:
    """bench/engine_bound.py: per model, the 1-client p50 over the engine's batch 1, then the
    median ratio to the engine's best batch (throughput for the HTTP-bound mlp) per client
    count; this tree's series ("after")."""
    first = next(iter(results.values()))["served"]["after"]
    counts = [int(c) for c in first]
    kinds = {"minilm": "engine-bound", "lstm": "short engine calls", "mlp": "HTTP-bound"}
    head = ["model", "1 client: p50 (minus the engine's batch 1)",
            *(f"{c:,} clients" for c in counts if c > 1)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, figures in results.items():
        served = figures["served"]["after"]
        one = served["1"]
        over = statistics.median(r["p50_ms"] - r["engine_batch1_ms"] for r in one)
        cells = [f"`{model}`" + (f" ({kinds[model]})" if model in kinds else ""),
                 f"{_median(one, 'p50_ms'):.2f} ms ({over:+.2f} ms)".replace("-", "\N{MINUS SIGN}")]
        for clients in (c for c in counts if c > 1):
            runs = served[str(clients)]
            cells.append(f"{_median(runs, 'items_per_s'):,.0f} req/s" if model == "mlp"
                         else f"{_median(runs, 'ratio'):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def serving(results: dict[str, Any], clients: str = "64") -> str:
    """bench/serving.py: req/s at 64 clients per transport, one row per model and Serval
    worker count, with the FastAPI baseline and the engine's ceiling from the same run."""
    head = ["model", "Serval JSON", "Serval binary", "gRPC unary", "gRPC stream",
            "FastAPI + ORT", "engine ceiling", "best Serval / ceiling"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, figures in results["models"].items():
        rows, ceiling = figures["rows"], figures["ceiling"]["best_items_per_s"]
        workers = sorted({label.rsplit(" w", 1)[1] for label in rows
                          if label.startswith("serval ")}, key=int)
        def rps(label: str, rows: dict[str, Any] = rows) -> float | None:
            step = rows.get(label, {}).get(clients)
            return None if step is None else float(step["throughput_rps"])

        for i, count in enumerate(workers):
            labels = [f"serval {kind} w{count}"
                      for kind in ("json", "binary", "grpc-unary", "grpc-stream")]
            served = [rps(label) for label in labels]
            json_step = rows.get(labels[0], {}).get(clients)
            cells = [f"`{model}`" + (f" (`--workers {count}`)" if len(workers) > 1 else "")]
            cells += ["" if v is None else f"{v:,.0f}" for v in served]
            if json_step is not None:
                cells[1] += f" req/s, p99 {json_step['p99_ms']:.1f} ms"
            fastapi = rps("fastapi json") if i == 0 else None
            cells.append("" if fastapi is None else f"{fastapi:,.0f}")
            cells.append("" if i else (f"{ceiling / 1000:,.0f}k items/s" if ceiling >= 1e5
                                       else f"{ceiling:,.0f} items/s"))
            best = max((v for v in served if v is not None), default=0.0)
            cells.append(f"{best / ceiling:.0%}")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def serving_ratios(results: dict[str, Any]) -> str:
    """bench/serving.py: the ratios it printed for that run, one bullet each."""
    return "".join(f"- {line}\n" for line in results["ratios"])


def _cpu(results: dict[str, Any]) -> str:
    """The run's CPU and the SIMD flags that INT8 and BF16 speed depend on."""
    cpu = results.get("cpu")
    if not isinstance(cpu, dict):
        return ""
    return (f"\nCPU of this run: {cpu['model'] or 'unknown'}, "
            f"{', '.join(cpu['simd']) or 'no AVX2'}.\n")


def optimize(results: dict[str, Any]) -> str:
    """bench/optimize.py: each goal of `serval optimize` with its figure from one run."""
    lines = ["| goal | measured | |", "|---|---|---|"]
    for goal in results["goals"]:
        bound = f"{'≥' if goal['at_least'] else '≤'} {goal['goal']:g}"
        lines.append(f"| {goal['label']}: {bound} | {goal['value']:.4f} | "
                     f"{'PASS' if goal['passed'] else 'MISS'} |")
    lines.append(f"| (minilm INT8 minimum cosine, for reference) | "
                 f"{results['int8_min_cosine']:.4f} | |")
    return "\n".join(lines) + "\n" + _cpu(results)


def openvino(results: dict[str, Any]) -> str:
    """bench/openvino_vs_ort.py: OpenVINO's items/s over ONNX Runtime's, per model and batch."""
    batches = list(next(iter(results["items_per_s"].values())))
    lines = ["| model | " + " | ".join(f"batch {b}" for b in batches) + " |",
             "|---|" + "---|" * len(batches)]
    for model, by_batch in results["items_per_s"].items():
        cells = [f"{by_batch[b]['ov'] / by_batch[b]['ort']:.2f}" for b in batches]
        lines.append(f"| `{model}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n" + _cpu(results)


def cluster(results: dict[str, Any]) -> str:
    """bench/cluster.py: each verdict it printed, measured figures in its own words."""
    lines = ["| measured against its goal | |", "|---|---|"]
    lines += [f"| {v['text'].replace('|', '/')} | {'pass' if v['passed'] else 'miss'} |"
              for v in results["verdicts"]]
    setup = (f"\n{results['nodes']} nodes at {results['node_cpus']:g} CPU each, "
             f"{results['clients']} clients, the median of {results['repeats']} runs of "
             f"{results['duration_s']:g} s per figure, {results['models']:,} models in the "
             f"locality part.\n")
    return "\n".join(lines) + "\n" + setup + _cpu(results)


# table name -> (the results file it reads, docs/results/<file>.json; its renderer)
RENDERERS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "optimize": ("optimize", optimize),
    "openvino": ("openvino", openvino),
    "cluster": ("cluster", cluster),
    "engine-bound": ("engine-bound", engine_bound),
    "serving": ("serving", serving),
    "serving-ratios": ("serving", serving_ratios),
}


def render(name: str) -> str:
    if name not in RENDERERS:
        raise SystemExit(f"no renderer for the generated table {name!r}")
    stem, renderer = RENDERERS[name]
    path = RESULTS / f"{stem}.json"
    if not path.is_file():
        raise SystemExit(f"{path.relative_to(ROOT)} is missing: run the benchmark with "
                         f"--json-out {path.relative_to(ROOT)}")
    return renderer(orjson.loads(path.read_bytes()))


def regions(text: str) -> list[tuple[str, str, str]]:
    """(name, the results file its marker names, current table) for each generated region."""
    return [(m["name"], m["file"], m["body"]) for m in REGION.finditer(text)]


def rewrite(text: str) -> str:
    return REGION.sub(lambda m: m["open"] + render(m["name"]) + m["close"], text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="report the regions that differ from their results; write nothing")
    args = parser.parse_args()
    stale = []
    for page in PAGES:
        text = page.read_text()
        new = rewrite(text)
        if new != text:
            stale.append(str(page.relative_to(ROOT)))
            if not args.check:
                page.write_text(new)
    verb = "differ from docs/results" if args.check else "rewritten"
    print(f"{verb}: {', '.join(stale)}" if stale else "every generated table is up to date")
    sys.exit(1 if stale and args.check else 0)


if __name__ == "__main__":
    main()
