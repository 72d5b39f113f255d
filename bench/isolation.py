"""The cost of `isolation: process`: the same engine in-process and in a worker process.

For `mlp` and `lstm` (ONNX Runtime, 2 threads) it measures, in rounds that alternate the two
(the best of each kept): batch-1 latency (median and p99 of --calls calls) and batch-32
throughput (items/s), then prints isolated/in-process ratios. The difference is the pipe round
trip and the tensor copies. `--json-out` keeps the figures; docs/production.md's table is rendered
from them (bench/doc_tables.py).

    .venv/bin/python bench/isolation.py --repository examples/models [--json-out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.procs import cpu_features
from serval.backends.base import LoadedModel
from serval.backends.isolated import IsolatedBackend
from serval.backends.onnxruntime import OnnxRuntimeBackend
from serval.protocol.types import TensorDict
from serval.repository.layout import scan_model

ROUNDS = 3


def main() -> None:
    args = _parse_args()
    out: dict[str, Any] = {"cpu": cpu_features(), "threads": 2, "calls": args.calls,
                           "rounds": ROUNDS, "models": {}}
    print(f"{'model':6} {'mode':11} {'b1 p50 ms':>10} {'b1 p99 ms':>10} {'b32 items/s':>12}")
    for name in ("mlp", "lstm"):
        directory = scan_model(args.repository, name)
        assert directory is not None, f"no {name} in {args.repository}"
        spec = directory.latest_spec()
        engine = OnnxRuntimeBackend(cores=2)
        models: dict[str, LoadedModel] = {"in-process": engine.load(spec),
                                          "isolated": IsolatedBackend(engine).load(spec)}
        results = _measure(models, args.calls)
        out["models"][name] = {mode: {"p50_ms": float(p50), "p99_ms": float(p99),
                                      "items_per_s": float(items)}
                               for mode, (p50, p99, items) in results.items()}
        for mode, (p50, p99, items) in results.items():
            print(f"{name:6} {mode:11} {p50:10.3f} {p99:10.3f} {items:12,.0f}")
        base, iso = results["in-process"], results["isolated"]
        print(f"{name:6} {'ratio':11} {iso[0] / base[0]:9.2f}x {iso[1] / base[1]:9.2f}x "
              f"{iso[2] / base[2]:11.2f}x  (isolated / in-process)")
        for model in models.values():
            model.unload()
    if args.json_out:
        args.json_out.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))


def _inputs(model: LoadedModel, rows: int) -> TensorDict:
    rng = np.random.default_rng(0)
    inputs: TensorDict = {}
    for spec in model.metadata.inputs:
        shape = (rows, *[d if d > 0 else 1 for d in spec.shape[1:]])
        if spec.datatype == "INT64":
            inputs[spec.name] = rng.integers(0, 1000, shape, dtype=np.int64)
        else:
            inputs[spec.name] = rng.random(shape, dtype=np.float32)
    return inputs


def _measure(models: dict[str, LoadedModel], calls: int
             ) -> dict[str, tuple[float, float, float]]:
    """Per mode: batch-1 p50/p99 latency (ms) and batch-32 throughput (items/s), the best of
    ROUNDS rounds that take the modes in turn (so drift on the box hits both alike)."""
    first = next(iter(models.values()))
    one, many = _inputs(first, 1), _inputs(first, 32)
    for model in models.values():
        for _ in range(20):
            model.infer(one)
    best = {mode: (float("inf"), float("inf"), 0.0) for mode in models}
    for _ in range(ROUNDS):
        for mode, model in models.items():
            latencies = []
            for _ in range(calls):
                started = time.perf_counter()
                model.infer(one)
                latencies.append(time.perf_counter() - started)
            started = time.perf_counter()
            batches = max(10, calls // 10)
            for _ in range(batches):
                model.infer(many)
            items = 32 * batches / (time.perf_counter() - started)
            p50, p99 = np.percentile(latencies, [50, 99]) * 1000
            was = best[mode]
            best[mode] = (min(was[0], p50), min(was[1], p99), max(was[2], items))
    return best


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--calls", type=int, default=1000, help="batch-1 calls per round")
    parser.add_argument("--json-out", type=Path, default=None)
    return parser.parse_args()


if __name__ == "__main__":
    main()
