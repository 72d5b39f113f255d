"""A /metrics flood (or another route's, --flood) against a server with many busy models: what
the good clients keep.

Serves --models small heads (bench/many_models.py's), sends each a request so that the top
100 get their own series, then measures a good client (--clients keep-alive connections
inferring on one model) for --seconds, first alone, then while --flooders connections scrape
/metrics as fast as answered. Prints, median of --rounds: the good client's req/s and p99 in
both phases, their ratio, the scrapes answered and the server's time per render. `--tree`
serves another checkout (the 'before' tree) for a before/after in one run.

    .venv/bin/python bench/metrics_flood.py [--models 150] [--tree /tmp/before]
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

from bench.many_models import IN, _generate
from bench.servers import (
    HOST,
    add_tree_option,
    free_ports,
    run_window,
    running,
    serval_command,
    tree_env,
)


def _body() -> bytes:
    return orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, IN],
                                     "data": np.ones(IN, np.float32).tolist()}]})


def _loop(port: int, method: str, path: str, body: bytes | None, stop: threading.Event,
          times: list[float]) -> None:
    """Requests one after another on one keep-alive connection; each one's seconds."""
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    while not stop.is_set():
        started = time.perf_counter()
        connection.request(method, path, body=body)
        reply = connection.getresponse()
        reply.read()
        if reply.status != 200:
            raise RuntimeError(f"{path}: HTTP {reply.status}")
        times.append(time.perf_counter() - started)
    connection.close()


def _phase(port: int, clients: int, flooders: int, seconds: float, flood: str = "GET /metrics"
           ) -> tuple[float, float, int, float]:
    """(good req/s, good p99 s, scrapes answered, mean scrape s) over one window."""
    good: list[list[float]] = [[] for _ in range(clients)]
    scrapes: list[list[float]] = [[] for _ in range(flooders)]
    body = _body()
    method, path = flood.split(" ", 1)
    payload = b"{}" if method == "POST" else None
    run_window([functools.partial(_loop, port, "POST", "/v2/models/tenant00000/infer", body,
                                  times=times) for times in good]
               + [functools.partial(_loop, port, method, path, payload, times=times)
                  for times in scrapes], seconds)
    latencies = sorted(t for times in good for t in times)
    scraped = [t for times in scrapes for t in times]
    return (len(latencies) / seconds, latencies[int(0.99 * (len(latencies) - 1))],
            len(scraped), statistics.mean(scraped) if scraped else 0.0)


def _render_s(port: int) -> float:
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    started = time.perf_counter()
    connection.request("GET", "/metrics")
    connection.getresponse().read()
    connection.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=150)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--flooders", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flood", default="GET /metrics",
                        help="the flooders' request: 'METHOD PATH' (a POST sends {})")
    add_tree_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "repository"
        _generate(root, args.models)
        port, grpc_port = free_ports(2)
        env = tree_env(args.tree) if args.tree else None
        with running(serval_command(root, port, 1, grpc_port), port, "/v2/health/ready",
                     Path(scratch) / "server.log", env):
            body = _body()
            connection = http.client.HTTPConnection(HOST, port, timeout=120)
            for index in range(args.models):  # every model busy: the top 100 get series
                connection.request("POST", f"/v2/models/tenant{index:05d}/infer", body=body)
                reply = connection.getresponse()
                reply.read()
                if reply.status != 200:
                    raise RuntimeError(f"tenant{index:05d}: HTTP {reply.status}")
            connection.close()
            render_s = min(_render_s(port) for _ in range(3))
            alone, flooded = [], []
            for _ in range(args.rounds):
                alone.append(_phase(port, args.clients, 0, args.seconds))
                flooded.append(_phase(port, args.clients, args.flooders, args.seconds,
                                      args.flood))
    rate_alone = statistics.median(r[0] for r in alone)
    rate_flooded = statistics.median(r[0] for r in flooded)
    p99_alone = statistics.median(r[1] for r in alone)
    p99_flooded = statistics.median(r[1] for r in flooded)
    print(f"{args.models} busy models, /metrics {render_s * 1000:.0f} ms a lone scrape; "
          f"{args.clients} good clients, {args.flooders} flooders of {args.flood}, "
          f"median of {args.rounds}")
    print(f"  alone:   {rate_alone:8.1f} req/s  p99 {p99_alone * 1000:7.1f} ms")
    print(f"  flooded: {rate_flooded:8.1f} req/s  p99 {p99_flooded * 1000:7.1f} ms  "
          f"scrapes answered {statistics.median(r[2] for r in flooded):.0f}")
    print(f"  good clients' throughput under the flood: {rate_flooded / rate_alone:.2f}x alone")


if __name__ == "__main__":
    main()
