"""On-line training while serving (seed 001): fine-tune `mlp` and publish a version every few
seconds; a server started with --poll-interval-s swaps each one in with no failed request.

    make serve   # in another terminal, or: serval serve -r examples/models --poll-interval-s 1
    HF_HUB_OFFLINE=1 .venv/bin/python examples/online_training.py --publishes 5 --traffic

With --traffic it also sends requests the whole time and reports the versions it saw answer
(they only move forward) and any failure.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import orjson
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.zoo import build_mlp, export

from serval.repository import store


def main() -> None:
    args = _parse_args()
    spec = build_mlp()  # the served version 1: same architecture, same starting weights
    optimizer = torch.optim.SGD(spec.module.parameters(), lr=0.05)
    teacher = torch.randn(256, 16, generator=torch.Generator().manual_seed(3))
    traffic = _Traffic(args.server) if args.traffic else None
    for step in range(1, args.publishes + 1):
        loss = _train(spec.module, optimizer, teacher, args.steps)
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "model.onnx"
            export(spec, path)
            version = store.publish(path, args.repository, "mlp",
                                    note=f"online step {step}, loss {loss:.4f}")
        print(f"published mlp version {version} (loss {loss:.4f})", flush=True)
        time.sleep(args.interval)
    if traffic is not None:
        traffic.stop()
        print(f"traffic: {traffic.answers} answers, {traffic.failures} failures, versions seen "
              f"in order: {traffic.versions}")
        if traffic.failures or traffic.versions != sorted(traffic.versions, key=int):
            raise SystemExit(1)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--server", default="127.0.0.1:8000", help="host:port for --traffic")
    parser.add_argument("--publishes", type=int, default=5)
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between publishes")
    parser.add_argument("--steps", type=int, default=20, help="SGD steps per publish")
    parser.add_argument("--traffic", action="store_true")
    return parser.parse_args()


def _train(module: torch.nn.Module, optimizer: torch.optim.Optimizer, teacher: torch.Tensor,
           steps: int) -> float:
    """A few SGD steps towards a fixed teacher's labels on fresh random inputs."""
    module.train()
    for _ in range(steps):
        x = torch.randn(64, 256)
        labels = (x @ teacher).argmax(dim=1)
        probabilities = module(x)
        loss = torch.nn.functional.nll_loss(torch.log(probabilities + 1e-9), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    module.eval()
    return loss.item()


class _Traffic(threading.Thread):
    """Requests back to back against the server; records answers' versions and failures."""

    def __init__(self, server: str) -> None:
        super().__init__(daemon=True)
        self.url = f"http://{server}/v2/models/mlp/infer"
        self.body = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                              "shape": [1, 256],
                                              "data": np.zeros(256).tolist()}]})
        self.answers, self.failures, self.versions = 0, 0, []
        self._halt = threading.Event()
        self.start()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                request = urllib.request.Request(self.url, data=self.body, method="POST")
                with urllib.request.urlopen(request, timeout=30) as reply:
                    version = orjson.loads(reply.read())["model_version"]
            except OSError:
                self.failures += 1
                continue
            self.answers += 1
            if not self.versions or self.versions[-1] != version:
                self.versions.append(version)

    def stop(self) -> None:
        self._halt.set()
        self.join()


if __name__ == "__main__":
    main()
