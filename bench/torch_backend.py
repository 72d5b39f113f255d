"""The pytorch backend on minilm: Serval serving TorchScript vs torch eager in-process.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/torch_backend.py [--before DIR] [--runs 3]

The ceiling is torch eager in this process at its best batch (8, 32 or 64). Then Serval serves
the same model traced (binary REST, one item per request) at `--clients` (items/s against the
ceiling), then at 1 client (p50 against eager's batch-1 latency: light traffic after load),
with what the engine did meanwhile (mean batch, milliseconds per batch, from the server's
statistics). `--before DIR`
serves another checkout (its src/ first on PYTHONPATH) right after this one in every run, so
both are measured against the same moment of this noisy box; medians of `--runs` are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers
from bench.zoo import build_minilm
from serval.loadtest.closed_loop import run_closed_loop
from serval.loadtest.http_client import encode_http_request

CONFIG = """\
backend: pytorch
max_batch_size: 64
inputs:
  - {name: input_ids, datatype: INT64, dims: [32]}
  - {name: attention_mask, datatype: INT64, dims: [32]}
outputs:
  - {name: embedding, datatype: FP32, dims: [384]}
"""
MODEL = "minilm-torch"
GOAL_SHARE = 0.90


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout, served right after this one in every run")
    args = parser.parse_args()
    torch.set_num_threads(2)
    module = build_minilm().module.eval()
    eager = {batch: _items_per_s(module, batch) for batch in (1, 8, 32, 64)}
    best = max(eager, key=lambda b: eager[b])
    print(f"torch eager in-process: {', '.join(f'batch {b}: {v:.0f}' for b, v in eager.items())}"
          f" items/s (best batch {best}; batch 1 {1000 / eager[1]:.2f} ms)")
    repository = Path(tempfile.mkdtemp(prefix="serval-torch-"))
    (repository / MODEL / "1").mkdir(parents=True)
    (repository / MODEL / "config.yaml").write_text(CONFIG)
    ids, mask = _inputs(2)
    with torch.no_grad():
        traced = torch.jit.trace(module, (ids, mask))
    traced.save(str(repository / MODEL / "1" / "model.pt"))
    del module, traced
    trees = {"this": None} | ({"before": args.before} if args.before else {})
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for run in range(args.runs):
        for name, tree in trees.items():
            record = _serve(repository, tree, args.clients, args.duration)
            results[name].append(record)
            print(f"  run {run + 1} {name:6}: 1 client p50 {record['p50_ms']:.2f} ms (engine "
                  f"{record['one']['infer_ms']:.2f} ms per call); {args.clients} clients "
                  f"{record['items_per_s']:.0f} items/s, batch {record['many']['mean_batch']:.1f}"
                  f" in {record['many']['infer_ms']:.1f} ms, errors {record['errors']}",
                  flush=True)
    for name, records in results.items():
        share = statistics.median(r["items_per_s"] for r in records) / eager[best]
        p50 = statistics.median(r["p50_ms"] for r in records)
        print(f"{'PASS' if share >= GOAL_SHARE else 'MISS'}  {name}: served TorchScript at "
              f"{args.clients} clients {share:.0%} of eager's best in-process throughput (goal "
              f"{GOAL_SHARE:.0%}); 1 client p50 {p50:.2f} ms vs eager batch 1 "
              f"{1000 / eager[1]:.2f} ms (medians of {len(records)})")


def _serve(repository: Path, tree: Path | None, clients: int, duration: float) -> dict[str, Any]:
    port = servers.free_port()
    env = None if tree is None else servers.tree_env(tree)
    with servers.running(servers.serval_command(repository, port, 1, 0), port,
                         "/v2/health/ready", repository / "server.log", env):
        before = servers.engine_totals(port, MODEL)
        many = run_closed_loop(servers.HOST, port, _requests(), clients, duration)
        middle = servers.engine_totals(port, MODEL)
        one = run_closed_loop(servers.HOST, port, _requests(), 1, duration / 2)
        after = servers.engine_totals(port, MODEL)
    return {"p50_ms": one.p50_ms, "items_per_s": many.throughput_rps,
            "errors": sum(many.errors.values()) + sum(one.errors.values()),
            "many": servers.engine_use(before, middle), "one": servers.engine_use(middle, after)}


def _inputs(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1000, 30000, (batch, 32), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch, 32, dtype=torch.int64)
    return ids, mask


def _items_per_s(module: torch.nn.Module, batch: int, seconds: float = 3.0) -> float:
    ids, mask = _inputs(batch)
    with torch.inference_mode():
        module(ids, mask)
        runs, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            module(ids, mask)
            runs += 1
    return runs * batch / (time.perf_counter() - started)


def _requests() -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(16):
        ids = rng.integers(1000, 30000, size=32).astype(np.int64)
        mask = np.ones(32, dtype=np.int64)
        header = orjson.dumps({"inputs": [
            {"name": "input_ids", "datatype": "INT64", "shape": [1, 32],
             "parameters": {"binary_data_size": 256}},
            {"name": "attention_mask", "datatype": "INT64", "shape": [1, 32],
             "parameters": {"binary_data_size": 256}}],
            "parameters": {"binary_data_output": True}})
        out.append(encode_http_request(
            "POST", "/v2/models/minilm-torch/infer", header + ids.tobytes() + mask.tobytes(),
            {"Inference-Header-Content-Length": str(len(header))}, servers.HOST))
    return out


if __name__ == "__main__":
    main()
