"""OpenVINO vs ONNX Runtime on the example models, in-process, same threads, same inputs.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/openvino_vs_ort.py --repository examples/models
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import openvino as ov
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import procs
from bench.workloads import model_file, model_spec, random_feeds

Run = Callable[[dict[str, np.ndarray]], object]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--models", default="mlp,lstm,minilm")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--json-out", type=Path, default=None,
                        help="items/s per model, batch and engine (docs/results/openvino.json)")
    args = parser.parse_args()
    print(f"{'model':8} {'batch':>5} {'ORT items/s':>12} {'OpenVINO items/s':>17} {'OV/ORT':>7}")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for model in args.models.split(","):
        path = model_file(args.repository, model)
        engines = {"ort": _ort(path, args.threads), "ov": _openvino(path, args.threads)}
        for batch in (1, 32):
            feed = random_feeds(model_spec(path), batch=batch, count=1, seed=0)[0]
            rates = {name: batch * _runs_per_s(run, feed, args.seconds)
                     for name, run in engines.items()}
            out.setdefault(model, {})[str(batch)] = rates
            print(f"{model:8} {batch:>5} {rates['ort']:>12,.0f} {rates['ov']:>17,.0f} "
                  f"{rates['ov'] / rates['ort']:>7.2f}")
    if args.json_out:
        args.json_out.write_bytes(orjson.dumps({"cpu": procs.cpu_features(),
                                                "threads": args.threads, "items_per_s": out},
                                               option=orjson.OPT_INDENT_2))


def _ort(path: Path, threads: int) -> Run:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda feed: session.run(None, feed)


def _openvino(path: Path, threads: int) -> Run:
    # as Serval's openvino backend compiles: the model's own precision (OpenVINO would pick
    # BF16 by itself on CPUs that have it)
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                           "PERFORMANCE_HINT": "LATENCY",
                                                           "INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    return lambda feed: request.infer(feed)


def _runs_per_s(run: Run, feed: dict[str, np.ndarray], seconds: float) -> float:
    run(feed)
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        run(feed)
        runs += 1
    return runs / (time.perf_counter() - started)


if __name__ == "__main__":
    main()
