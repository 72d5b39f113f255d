"""Serval standalone against Serval on Ray Serve (with and without the Serval ingress), `lstm`
at 1 and 64 clients, one binary REST row per request, in one run on the whole box.

    .venv/bin/python bench/ray_serve.py [--duration 10] [--json-out docs/results/ray-serve.json]

Each path is started alone (nothing else served meanwhile), warmed for 3 s, then measured at
each client count. Ray gets the box's cores (`num_cpus=2`), one replica of one CPU. Without the
ingress, every request carries `serve_multiplexed_model_id`, as Ray's proxy needs for placement.
`--json-out` keeps every figure; docs/ray-serve.md's table is rendered from it
(bench/doc_tables.py).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import procs, servers
from bench.ray_path import multiplexed, ray_serval
from bench.workloads import infer_requests, model_file, model_spec, random_feeds
from serval.loadtest.closed_loop import run_closed_loop

MODEL = "lstm"
PATHS = ("standalone", "ray-ingress", "ray-direct")  # bench/doc_tables.ray_serve names them

KEPT = ("concurrency", "requests", "errors", "throughput_rps", "p50_ms", "p90_ms", "p99_ms")


def main() -> None:
    args = _parse_args()
    work = Path(tempfile.mkdtemp(prefix="serval-ray-serve-"))
    repo = servers.only(args.repository, [MODEL], work)
    feeds = random_feeds(model_spec(model_file(args.repository, MODEL)), 1, 64)
    requests = infer_requests(MODEL, feeds, True, servers.HOST)
    rows: dict[str, dict[str, Any]] = {}
    for path in args.paths:
        with _serving(path, repo, work) as port:
            sent = multiplexed(requests, MODEL) if path == "ray-direct" else requests
            run_closed_loop(servers.HOST, port, sent, max(args.clients), 3.0, 1.0)  # warm up
            rows[path] = {}
            for clients in args.clients:
                step = run_closed_loop(servers.HOST, port, sent, clients, args.duration, 1.0)
                rows[path][str(clients)] = {key: getattr(step, key) for key in KEPT}
                print(f"{path:12} {clients:>3} clients: {step.throughput_rps:8,.0f} req/s, "
                      f"p50 {step.p50_ms:6.2f} ms, errors {dict(step.errors) or 0}", flush=True)
    out = {"cpu": procs.cpu_features(), "model": MODEL, "duration_s": args.duration,
           "clients": args.clients, "rows": rows}
    if args.json_out:
        args.json_out.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))


@contextlib.contextmanager
def _serving(path: str, repo: Path, work: Path) -> Iterator[int]:
    if path == "standalone":
        port, grpc_port = servers.free_ports(2)
        command = servers.serval_command(repo, port, 1, grpc_port)
        with servers.running(command, port, "/v2/health/ready", work / "standalone.log"):
            yield port
    else:
        with ray_serval(repo, None, ingress=path == "ray-ingress") as port:
            yield port


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--clients", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 64])
    parser.add_argument("--paths", type=lambda s: s.split(","), default=list(PATHS))
    parser.add_argument("--json-out", type=Path, default=None)
    return parser.parse_args()


if __name__ == "__main__":
    main()
