"""The pytorch backend on minilm: Serval serving TorchScript vs torch eager in-process.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/torch_backend.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

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
GOAL_SHARE = 0.90


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    torch.set_num_threads(2)
    module = build_minilm().module.eval()
    eager = {batch: _items_per_s(module, batch) for batch in (8, 32, 64)}
    best = max(eager, key=lambda b: eager[b])
    repository = Path(tempfile.mkdtemp(prefix="serval-torch-"))
    (repository / "minilm-torch" / "1").mkdir(parents=True)
    (repository / "minilm-torch" / "config.yaml").write_text(CONFIG)
    ids, mask = _inputs(2)
    with torch.no_grad():
        traced = torch.jit.trace(module, (ids, mask))
    traced.save(str(repository / "minilm-torch" / "1" / "model.pt"))
    del module, traced
    port = servers.free_port()
    with servers.running(servers.serval_command(repository, port, 1, 0), port,
                         "/v2/health/ready", repository / "server.log"):
        served = run_closed_loop(servers.HOST, port, _requests(), args.clients, args.duration)
    share = served.throughput_rps / eager[best]
    print(f"torch eager in-process: {', '.join(f'batch {b}: {v:.0f}' for b, v in eager.items())}"
          f" items/s (best batch {best})")
    print(f"Serval pytorch backend (TorchScript) @{args.clients}: {served.throughput_rps:.0f} "
          f"req/s, p99 {served.p99_ms:.0f} ms, errors {served.errors or 0}")
    print(f"{'PASS' if share >= GOAL_SHARE else 'MISS'}  served TorchScript within 10% of "
          f"eager's best in-process throughput ({share:.0%})")


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
