"""The benchmark tables of the README and docs/, rendered from the benchmarks' own JSON output.

A page holds a generated table between two markers:

    <!-- generated: NAME (docs/results/FILE.json); edit the renderer, not the table -->
    | ... |
    <!-- end generated -->

`docs/results/FILE.json` is what the benchmark wrote with `--json-out` (committed, so the
figures a page quotes can be traced to one run), and RENDERERS[NAME] turns it into the table.
A region may name several files, comma-separated; its renderer then takes each, in that order.
`python bench/doc_tables.py` rewrites every marked region; `--check` only reports those that
differ (the test suite runs it, so a hand-edited figure fails).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REGION = re.compile(r"^(?P<open>(?P<indent>[ \t]*)<!-- generated: (?P<name>[a-z0-9-]+) \("
                    r"(?P<files>docs/results/[a-z0-9-]+\.json(?:, docs/results/[a-z0-9-]+\.json)*)"
                    r"\); edit the renderer, not the table -->\n)(?P<body>.*?)"
                    r"(?P<close>[ \t]*<!-- end generated -->)", re.S | re.M)
FILE = re.compile(r"docs/results/([a-z0-9-]+)\.json")


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


def ray_serve(results: dict[str, Any]) -> str:
    """bench/ray_serve.py: each path's 1-client p50 and many-client req/s against standalone."""
    few, many = (str(c) for c in (min(results["clients"]), max(results["clients"])))
    rows = results["rows"]
    alone = rows["standalone"]
    lines = [f"| path, `{results['model']}`, one row per request | {few} client p50 | "
             f"{many} clients req/s | vs standalone |", "|---|---|---|---|"]
    names = {"standalone": "standalone `serval serve`",
             "ray-ingress": "Ray proxy → Serval ingress → replica",
             "ray-direct": "Ray proxy → replica (`ingress: false`)"}
    for path, figures in rows.items():
        share = figures[many]["throughput_rps"] / alone[many]["throughput_rps"]
        lines.append(f"| {names[path]} | {figures[few]['p50_ms']:.2f} ms | "
                     f"{figures[many]['throughput_rps']:,.0f} | {share:.0%} |")
    added = [f"{figures[few]['p50_ms'] - alone[few]['p50_ms']:.1f} ms"
             for path, figures in rows.items() if path != "standalone"]
    return ("\n".join(lines) + f"\n\nRay's paths add {' and '.join(added)} at one client "
            f"(p50, in the order above); {results['duration_s']:g} s per figure.\n" + _cpu(results))


def gpu(results: dict[str, Any]) -> str:
    """bench/gpu_minilm.py: served `minilm` on CUDA against the raw engine's best batch, one row
    per precision and worker count."""
    raw = results["raw"]
    times = "\N{MULTIPLICATION SIGN}"
    lines = [f"| | raw engine, best batch | served, 256 clients {times} 1 item | served, 16 "
             f"clients {times} best batch | 1 client p50 (engine batch 1) |",
             "|---|---|---|---|---|"]
    for i, (workers, by_precision) in enumerate(results["served"].items()):
        for name, figures in by_precision.items():
            best = str(raw[name]["best_batch"])
            ceiling = raw[name]["batches"][best]["items_per_s"]
            label = f"{name}, " + ("1 worker" if workers == "1" else f"`--workers {workers}`")
            cells = [label, f"{ceiling:,.0f} items/s (batch {best})" if i == 0 else ""]
            for rate in (figures["one_item"].get("256"), figures["whole_batches"]["items_per_s"]):
                cells.append("" if rate is None else f"{rate:,.0f} ({rate / ceiling:.2f})")
            engine = raw[name]["batches"]["1"].get("p50_ms")
            cells.append(f"{figures['one_client_p50_ms']:.2f} ms"
                         + ("" if engine is None else f" ({engine:.2f} ms)"))
            lines.append("| " + " | ".join(cells) + " |")
    parity = [f"{name}: cosine {f['cosine_mean']:.4f} mean, {f['cosine_min']:.4f} minimum"
              for name, f in next(iter(results["served"].values())).items()
              if f.get("cosine_mean") is not None]
    text = [f"One run on {results['device']} ({results['cores']} cores, torch "
            f"{results['torch']}), sequences of {results['seq_len']} tokens, binary REST. "
            f"Against the raw fp32 embeddings: {'; '.join(parity)}."]
    if "transcribed" in results:
        text.append(results["transcribed"])
    return "\n".join(lines) + "\n" + "".join(f"\n{textwrap.fill(t, 99)}\n" for t in text)


def isolation(results: dict[str, Any]) -> str:
    """bench/isolation.py: engine calls in-process against `isolation: process`, per model."""
    lines = ["| model | batch-1 p50 | batch-1 p99 | batch-32 items/s |", "|---|---|---|---|"]
    for model, modes in results["models"].items():
        base, iso = modes["in-process"], modes["isolated"]
        share = iso["items_per_s"] / base["items_per_s"]
        lines.append(
            f"| `{model}` in-process / isolated | {base['p50_ms']:.3f} / {iso['p50_ms']:.3f} ms | "
            f"{base['p99_ms']:.3f} / {iso['p99_ms']:.3f} ms | {base['items_per_s']:,.0f} / "
            f"{iso['items_per_s']:,.0f} ({share:.2f}\N{MULTIPLICATION SIGN}) |")
    return "\n".join(lines) + "\n" + _cpu(results)


def instructions(results: dict[str, Any]) -> str:
    """bench/instructions.py: CPU instructions per request, tree B over tree A, per mode and
    client count (median of the repeats; each build's count in thousands beside it)."""
    modes = list(results["runs"][0]["per_request"])
    lines = ["| clients | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for run in results["runs"]:  # every run counts the same modes (bench/instructions.py)
        medians = [(statistics.median(run["per_request"][mode]["A"]),
                    statistics.median(run["per_request"][mode]["B"])) for mode in modes]
        lines.append(f"| {run['concurrency']} | " + " | ".join(
            f"{b / a:.3f} ({a / 1000:,.0f}k / {b / 1000:,.0f}k)" for a, b in medians) + " |")
    note = (f"B/A (A / B instructions per request), `{results['model']}`, median of "
            f"{results['repeats']}; A = {results['a']}, B = {results['b']}.")
    return "\n".join(lines) + "\n\n" + textwrap.fill(note, 99) + "\n" + _cpu(results)


_EFFICIENCY = re.compile(r"efficiency (\S+) (.+?): ([0-9.]+) of")


def scale_measured(serving_results: dict[str, Any], ray_results: dict[str, Any],
                   cluster_results: dict[str, Any]) -> str:
    """docs/scale.md: the measured figures beside the plan's symbols, from make bench,
    make bench-ray and make bench-cluster."""
    def rps(model: str, label: str) -> str:
        step = serving_results["models"][model]["rows"].get(label, {}).get("64")
        return "n/a" if step is None else f"{step['throughput_rps']:,.0f}"

    mlp = {kind: rps("mlp", f"serval {kind} w1") for kind in ("json", "binary", "grpc-unary")}
    alone = ray_results["rows"]["standalone"]["64"]["throughput_rps"]
    ray = ray_results["rows"]["ray-ingress"]["64"]["throughput_rps"]
    texts = [v["text"] for v in cluster_results["verdicts"]]
    efficiency: dict[str, list[str]] = {}
    for text in texts:
        if m := _EFFICIENCY.match(text):
            efficiency.setdefault(m[1], []).append(f"{m[3]} ({m[2]})")
    locality = []
    for text in texts:
        head, _, figure = text.partition(": ")
        if head.startswith("locality") and "errors" not in figure:
            qualifier = head.removeprefix("locality").strip(" ()")
            locality.append(figure.split(" (goal")[0] + (f" ({qualifier})" if qualifier else ""))
    rows = [
        ("S", f"`mlp`, 64 clients, one process: {mlp['json']} req/s REST JSON, {mlp['binary']} "
              f"binary, {mlp['grpc-unary']} gRPC", "`make bench` (serving.json)"),
        ("S_lstm", f"`lstm`, 64 clients, one process, binary REST: {alone:,.0f} req/s",
         "`make bench-ray` (ray-serve.json)"),
        ("E", "; ".join(f"`{model}` " + ", ".join(values) for model, values in efficiency.items())
         + f" ({cluster_results['nodes']} nodes at {cluster_results['node_cpus']:g} CPU)",
         "`make bench-cluster` (cluster.json)"),
        ("h", "; ".join(locality), "`make bench-cluster` (cluster.json)"),
        ("Ray", f"`lstm` through Ray's proxy and the Serval ingress: {ray:,.0f} req/s "
                f"({ray / alone:.0%} of S_lstm)", "`make bench-ray` (ray-serve.json)"),
    ]
    lines = ["| symbol | measured on this box | by |", "|---|---|---|"]
    lines += [f"| {symbol} | {figure} | {source} |" for symbol, figure, source in rows]
    return "\n".join(lines) + "\n" + _cpu(serving_results)


# table name -> (the results files it reads, docs/results/<file>.json, in order; its renderer)
RENDERERS: dict[str, tuple[tuple[str, ...], Callable[..., str]]] = {
    "optimize": (("optimize",), optimize),
    "openvino": (("openvino",), openvino),
    "cluster": (("cluster",), cluster),
    "engine-bound": (("engine-bound",), engine_bound),
    "serving": (("serving",), serving),
    "serving-ratios": (("serving",), serving_ratios),
    "ray-serve": (("ray-serve",), ray_serve),
    "gpu": (("gpu",), gpu),
    "isolation": (("isolation",), isolation),
    "instructions": (("instructions",), instructions),
    "scale-measured": (("serving", "ray-serve", "cluster"), scale_measured),
}


def render(name: str) -> str:
    if name not in RENDERERS:
        raise SystemExit(f"no renderer for the generated table {name!r}")
    stems, renderer = RENDERERS[name]
    results = []
    for stem in stems:
        path = RESULTS / f"{stem}.json"
        if not path.is_file():
            raise SystemExit(f"{path.relative_to(ROOT)} is missing: run the benchmark with "
                             f"--json-out {path.relative_to(ROOT)}")
        results.append(orjson.loads(path.read_bytes()))
    return str(renderer(*results))


def regions(text: str) -> list[tuple[str, tuple[str, ...], str]]:
    """(name, the results files its marker names, current table) for each generated region; a
    region indented under a list item has its table indented alike (given here without)."""
    return [(m["name"], tuple(FILE.findall(m["files"])),
             "".join(line.removeprefix(m["indent"]) for line in m["body"].splitlines(True)))
            for m in REGION.finditer(text)]


def _indent(table: str, indent: str) -> str:
    return "".join(indent + line if line.strip() else line for line in table.splitlines(True))


def rewrite(text: str) -> str:
    return REGION.sub(lambda m: m["open"] + _indent(render(m["name"]), m["indent"])
                      + m["indent"] + "<!-- end generated -->", text)


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
