"""Engine-bound models served vs the raw engine's best batch, at 1 to 1,000 clients, in one run.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/engine_bound.py --repository examples/models

Per model: the ceiling is ONNX Runtime in this process (intra-op threads = the cores this process
may use, spinning on and off, every batch size up to the model's max_batch_size; the best of
all). Then one Serval process (binary REST, one item per request) is driven at each client count,
`--runs` times (median reported), with the mean batch size the server formed (from its
statistics). Before each step the engine's best batch (and batch 1 before a 1-client step) is
timed again, and the step's ratio is against that figure: this box drifts by 20-40% within
minutes, so a ceiling taken once would skew every later ratio. `--before DIR` also runs another
checkout's server (its src/ first on PYTHONPATH) right after this one's, at every step.
Prints the ratio per model and client count and the 1-client p50 over the engine's batch-1
latency; `--json-out` keeps every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers
from bench.engine_ceiling import time_runs
from bench.workloads import infer_requests, max_batch, model_file, model_spec, random_feeds
from serval.backends.cores import usable_cores
from serval.loadtest.closed_loop import run_closed_loop

BATCHES = (1, 4, 8, 16, 32, 64, 128, 256)
GOALS = {"minilm": 0.95, "lstm": 0.90}


def main() -> None:
    args = _parse_args()
    logs = Path(tempfile.mkdtemp(prefix="serval-engine-bound-"))
    out: dict[str, Any] = {}
    summary: list[str] = []
    for model in args.models:
        onnx_file = model_file(args.repository, model)
        ceiling = measure(onnx_file, max_batch(args.repository, model), args.engine_seconds)
        print(f"{model}: engine ceiling {ceiling['best']:,.0f} items/s (batch "
              f"{ceiling['best_batch']}, spinning {ceiling['best_spinning']}); batch-1 "
              f"{ceiling['batch1_ms']:.3f} ms", flush=True)
        served = serve(args, model, logs, ceiling)
        out[model] = {"ceiling": ceiling, "served": served}
        summary += _summary(model, served)
    print("\n--- ratios (this run; each step against the engine measured just before it) ---")
    for line in summary:
        print(line)
    print(f"server logs: {logs}")
    if args.json_out:
        args.json_out.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2
                                               | orjson.OPT_NON_STR_KEYS))


def _summary(model: str, served: dict[str, dict[int, list[dict[str, Any]]]]) -> list[str]:
    lines = []
    for build, by_clients in served.items():
        for clients, runs in by_clients.items():
            ratio = statistics.median(r["ratio"] for r in runs)
            each = ", ".join(f"{r['ratio']:.2f}" for r in runs)
            line = (f"{model:7} {build:6} {clients:>5} clients: "
                    f"{statistics.median(r['items_per_s'] for r in runs):8,.0f} items/s = "
                    f"{ratio:.2f} of ceiling ({each}), batch "
                    f"{statistics.median(r['mean_batch'] for r in runs):5.1f}")
            if clients == 1:
                over = statistics.median(r["p50_ms"] - r["engine_batch1_ms"] for r in runs)
                line += (f", p50 {statistics.median(r['p50_ms'] for r in runs):.2f} ms = "
                         f"engine batch-1 {over:+.2f} ms")
            goal = GOALS.get(model)
            if goal is not None and clients > 1:
                line += f"  {'PASS' if ratio >= goal else 'MISS'} (goal {goal:.2f})"
            elif clients == 1 and model in GOALS:
                line += f"  {'PASS' if over <= 0.5 else 'MISS'} (goal +0.50)"
            lines.append(line)
    return lines


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--models", type=lambda s: s.split(","), default=["minilm", "lstm", "mlp"])
    parser.add_argument("--clients", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 64, 256, 1000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--engine-seconds", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=1, help="Serval --workers")
    parser.add_argument("--serve-arg", action="append", default=[],
                        help="extra argument for serval serve (repeatable)")
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout: its server measured beside this one's, "
                        "step by step")
    parser.add_argument("--json-out", type=Path, default=None)
    return parser.parse_args()


def measure(onnx_file: Path, max_batch: int, seconds: float) -> dict[str, Any]:
    """Best items/s over batch sizes and spinning on/off, in-process, every usable core."""
    spec = model_spec(onnx_file)
    by: dict[str, dict[int, float]] = {}
    batch1_ms = float("inf")
    for spinning in ("0", "1"):
        session = _session(onnx_file, spinning == "1")
        by[spinning] = {}
        for batch in [b for b in BATCHES if b <= max_batch]:
            feed = random_feeds(spec, batch, 1)[0]
            durations = time_runs(session, feed, seconds)
            by[spinning][batch] = batch / float(np.median(durations))
            if batch == 1:
                batch1_ms = min(batch1_ms, float(np.median(durations)) * 1e3)
        del session
    spinning, batch = max(((s, b) for s in by for b in by[s]), key=lambda sb: by[sb[0]][sb[1]])
    return {"best": by[spinning][batch], "best_batch": batch, "best_spinning": spinning == "1",
            "batch1_ms": batch1_ms, "by_batch": by}


def _session(onnx_file: Path, spinning: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = usable_cores()
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])


def serve(args: argparse.Namespace, model: str, logs: Path, ceiling: dict[str, Any]
          ) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Each build's server at each client count, `runs` times; before every step the engine's
    best batch (and, for 1 client, batch 1) is timed again in this process, so each ratio
    compares two figures taken within seconds of each other on this noisy box."""
    spec = model_spec(model_file(args.repository, model))
    requests = infer_requests(model, random_feeds(spec, 1, 16, seed=0), True, servers.HOST)
    alone = servers.only(args.repository, [model], logs)
    builds = {"after": None} if args.before is None else {"before": args.before, "after": None}
    session = _session(model_file(args.repository, model), ceiling["best_spinning"])
    best_feed = random_feeds(spec, ceiling["best_batch"], 1)[0]
    one_feed = random_feeds(spec, 1, 1)[0]
    results: dict[str, dict[int, list[dict[str, Any]]]] = {
        build: {c: [] for c in args.clients} for build in builds}
    with contextlib.ExitStack() as stack:
        ports = {build: stack.enter_context(_server(args, alone, model, tree, logs, build))
                 for build, tree in builds.items()}
        for run in range(args.runs):
            for clients in args.clients:
                now = ceiling["best_batch"] / float(np.median(
                    time_runs(session, best_feed, args.engine_seconds)))
                batch1_ms = float(np.median(time_runs(session, one_feed, 1.0))) * 1e3 \
                    if clients == 1 else 0.0
                for build, port in ports.items():
                    record = _step(port, model, requests, clients, args.duration)
                    record.update(engine_items_per_s=now, engine_batch1_ms=batch1_ms,
                                  ratio=record["items_per_s"] / now)
                    results[build][clients].append(record)
                    print(f"  run {run + 1} {build:6} {clients:>5} clients: "
                          f"{record['items_per_s']:9,.0f} items/s = {record['ratio']:.2f} of "
                          f"{now:,.0f}, p50 {record['p50_ms']:7.2f} ms, batch "
                          f"{record['mean_batch']:5.1f}, errors {record['errors']}", flush=True)
    return results


@contextlib.contextmanager
def _server(args: argparse.Namespace, repository: Path, model: str, tree: Path | None,
            logs: Path, build: str) -> Iterator[int]:
    port = servers.free_port()
    command = servers.serval_command(repository, port, args.workers, 0) + args.serve_arg
    with servers.running(command, port, "/v2/health/ready", logs / f"serval-{model}-{build}.log",
                         None if tree is None else servers.tree_env(tree)):
        servers.get_json(port, f"/v2/models/{model}")
        yield port


def _step(port: int, model: str, requests: list[bytes], clients: int,
          duration: float) -> dict[str, Any]:
    before = servers.engine_totals(port, model)
    step = run_closed_loop(servers.HOST, port, requests, clients, duration,
                           processes=1 if clients <= 256 else 2)
    use = servers.engine_use(before, servers.engine_totals(port, model))
    return {"items_per_s": step.throughput_rps, "p50_ms": step.p50_ms, "p99_ms": step.p99_ms,
            "errors": sum(step.errors.values()), "mean_batch": use["mean_batch"]}


if __name__ == "__main__":
    main()
