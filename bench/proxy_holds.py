"""One model overloaded behind HAProxy: what the clients of another model keep.

`serval cluster up --nodes 1` serves `mlp` and `lstm` (the latter with one request at a time
and a queue of one, so a storm gets 429 with Retry-After). HAProxy shares backend connections
between clients (`http-reuse always`). --clients keep-alive connections infer on `mlp` for
--seconds, alone, then while --storm connections send `lstm` requests as fast as answered,
ignoring Retry-After. A node that held every request of a connection after a 429 held the
`mlp` requests that came on it too (then refused them), and a held request's own 429 held the
connection again, so a proxy's connection stayed held after the storm. Prints the `mlp`
clients' req/s alone (before any storm), under the storm (median of --rounds, with their failed
requests and p99, and the storm's 429s) and alone again after the storms. `--tree` serves
another checkout (the 'before' tree) for a before/after in one run.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/proxy_holds.py [--tree /tmp/before]
"""

from __future__ import annotations

import argparse
import functools
import http.client
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.servers import (
    HOST,
    add_tree_option,
    free_ports,
    get_json,
    run_window,
    running,
    tree_env,
)

STORMED = "backend: onnxruntime\nmax_batch_size: 1\nbatching: {max_queue_size: 1}\n"
Answers = list[tuple[int, float]]  # (status, seconds) per request


def _repository(models: Path, root: Path) -> Path:
    for name in ("mlp", "lstm"):
        (root / name).mkdir(parents=True)
        (root / name / "1").symlink_to((models / name / "1").resolve())
    (root / "mlp" / "config.yaml").write_text((models / "mlp" / "config.yaml").read_text())
    (root / "lstm" / "config.yaml").write_text(STORMED)
    return root


def _body(port: int, model: str) -> bytes:
    """One row of ones for the model's first input (free dims as 32)."""
    spec = get_json(port, f"/v2/models/{model}")["inputs"][0]
    shape = [1] + [size if size > 0 else 32 for size in spec["shape"][1:]]
    dtype = {"FP32": np.float32, "INT64": np.int64}[spec["datatype"]]
    return orjson.dumps({"inputs": [{"name": spec["name"], "datatype": spec["datatype"],
                                     "shape": shape, "data": np.ones(shape, dtype).ravel()
                                     .tolist()}]})


def _loop(port: int, path: str, body: bytes, stop: threading.Event, answers: Answers
          ) -> None:
    connection = http.client.HTTPConnection(HOST, port, timeout=60)
    while not stop.is_set():
        started = time.perf_counter()
        connection.request("POST", path, body=body)
        reply = connection.getresponse()
        reply.read()
        answers.append((reply.status, time.perf_counter() - started))
    connection.close()


def _phase(port: int, clients: int, storm: int, seconds: float, bodies: tuple[bytes, bytes]
           ) -> tuple[Answers, Answers]:
    good: list[Answers] = [[] for _ in range(clients)]
    bad: list[Answers] = [[] for _ in range(storm)]
    run_window([functools.partial(_loop, port, "/v2/models/mlp/infer", bodies[0], answers=a)
                for a in good]
               + [functools.partial(_loop, port, "/v2/models/lstm/infer", bodies[1], answers=a)
                  for a in bad], seconds)
    return [x for a in good for x in a], [x for a in bad for x in a]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--storm", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    add_tree_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = _repository(args.repository, Path(scratch) / "repository")
        (port,) = free_ports(1)
        command = [sys.executable, "-m", "serval", "cluster", "up", "-r", str(root),
                   "--nodes", "1", "--http-port", str(port), "--grpc-port", "0", "--",
                   "--log-level", "warning"]
        env = tree_env(args.tree) if args.tree else None
        stormed, failed, p99, refused = [], [], [], []
        with running(command, port, "/v2/health/ready", Path(scratch) / "log", env):
            bodies = (_body(port, "mlp"), _body(port, "lstm"))
            alone = len(_phase(port, args.clients, 0, args.seconds, bodies)[0]) / args.seconds
            for _ in range(args.rounds):
                good, bad = _phase(port, args.clients, args.storm, args.seconds, bodies)
                stormed.append(len(good) / args.seconds)
                failed.append(sum(status != 200 for status, _ in good))
                times = sorted(seconds for _, seconds in good)
                p99.append(times[int(len(times) * 0.99)] * 1e3)
                refused.append(sum(status == 429 for status, _ in bad))
            after = len(_phase(port, args.clients, 0, args.seconds, bodies)[0]) / args.seconds
    storm_rate = statistics.median(stormed)
    print(f"{args.tree or 'this tree'}: {args.clients} mlp clients through HAProxy, "
          f"{args.storm} storming lstm, {args.seconds:.0f} s windows, median of {args.rounds}")
    print(f"  mlp alone {alone:,.0f} req/s; under the storm {storm_rate:,.0f} req/s "
          f"({storm_rate / alone:.2f}x), {statistics.median(failed):.0f} failed, p99 "
          f"{statistics.median(p99):.1f} ms (the storm's 429s "
          f"{statistics.median(refused):.0f}); alone after it {after:,.0f} req/s "
          f"({after / alone:.2f}x)")


if __name__ == "__main__":
    main()
