"""An engine with `isolation: process` and instances 1 vs N: items per second.

For each model (ONNX Runtime, the server's cores), `instances: 1` and `instances: N` are
loaded through IsolatedBackend as the server loads them, then N threads (the batcher's N
consumers) call infer() at once with batches of --batch rows for --seconds, in rounds that
alternate the two; the median of the rounds is printed with the ratio. Before each instance
had a worker process of its own, N instances shared one process that ran one batch at a time,
each session on cores / N threads (2 cores, batch 8: mlp 0.98x, lstm 0.60x, with this script
run against the old tree through PYTHONPATH); now each instance has a process on cores / N
threads.

    .venv/bin/python bench/isolated_instances.py [--models mlp lstm] [--instances 2]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import threading
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.isolation import _inputs
from bench.servers import run_window
from serval.backends.base import LoadedModel
from serval.backends.cores import usable_cores
from serval.backends.isolated import IsolatedBackend
from serval.backends.onnxruntime import OnnxRuntimeBackend
from serval.repository.layout import scan_model


def _items_per_s(model: LoadedModel, threads: int, rows: int, seconds: float) -> float:
    batch = _inputs(model, rows)
    done = [0] * threads

    def run(slot: int, stop: threading.Event) -> None:
        while not stop.is_set():
            model.infer(batch)
            done[slot] += rows

    run_window([functools.partial(run, slot) for slot in range(threads)], seconds)
    return sum(done) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--models", nargs="+", default=["mlp", "lstm"])
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    backend = IsolatedBackend(OnnxRuntimeBackend(cores=usable_cores()))
    print(f"{usable_cores()} cores, {args.instances} threads calling, batch {args.batch}, "
          f"median of {args.rounds} rounds of {args.seconds:.0f} s")
    for name in args.models:
        directory = scan_model(args.repository, name)
        assert directory is not None, f"no {name} in {args.repository}"
        spec = directory.latest_spec()
        loaded = {count: backend.load(replace(spec, config=spec.config.model_copy(
            update={"instances": count}))) for count in (1, args.instances)}
        rates: dict[int, list[float]] = {count: [] for count in loaded}
        for _ in range(args.rounds):
            for count, model in loaded.items():
                rates[count].append(_items_per_s(model, args.instances, args.batch,
                                                 args.seconds))
        one, many = (statistics.median(rates[count]) for count in loaded)
        print(f"  {name:6} instances 1: {one:9,.0f} items/s   instances {args.instances}: "
              f"{many:9,.0f} items/s   ({many / one:.2f}x)")
        for model in loaded.values():
            model.unload()


if __name__ == "__main__":
    main()
