"""2,000 concurrent clients on `minilm`: the server stays up, answers only 200 or 429, keeps the
accepted requests' p99 within the configured timeout and its RSS under a fixed bound.

Serves a copy of the example `minilm` with a bounded queue (`batching.max_queue_size`) and a
default deadline (`--default-timeout-ms`), drives --clients keep-alive closed-loop clients (two
generator processes; the open-file limit is raised to the hard limit), samples the server's RSS
every second, and prints PASS/MISS against each goal.

    .venv/bin/python bench/overload.py --repository examples/models [--clients 2000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import procs, servers
from serval.loadtest.closed_loop import encode_http_request, run_closed_loop

RSS_BOUND_BYTES = 2 * 1024**3
CONFIG = "backend: onnxruntime\nmax_batch_size: 32\nbatching:\n  max_queue_size: {queue}\n"


def main() -> None:
    args = _parse_args()
    limit = procs.raise_open_files_limit()
    if limit < 2 * args.clients + 256:
        sys.exit(f"open-file limit {limit} is too low for {args.clients} clients; raise ulimit -n")
    root = Path(tempfile.mkdtemp(prefix="serval-overload-"))
    shutil.copytree(args.repository / "minilm" / "1", root / "minilm" / "1")
    (root / "minilm" / "config.yaml").write_text(CONFIG.format(queue=args.queue))
    port = servers.free_port()
    command = [*servers.serval_command(root, port, 1, 0),
               "--default-timeout-ms", str(args.timeout_ms)]
    samples: list[int] = []
    with servers.running(command, port, "/v2/health/ready", root / "server.log"):
        pid = procs.server_pid(port)
        stop = threading.Event()
        sampler = threading.Thread(target=_sample, args=(pid, samples, stop), daemon=True)
        sampler.start()
        result = run_closed_loop(servers.HOST, port, [_request()], args.clients, args.duration,
                                 warmup_s=5.0, processes=2, timeout_s=60.0)
        stop.set()
        alive = bool(servers.get_json(port, "/v2").get("name"))
        stats = servers.get_json(port, "/v2/models/minilm/stats")
    shutil.rmtree(root, ignore_errors=True)
    _report(args, result, samples, alive, stats)


def _request() -> bytes:
    rng = np.random.default_rng(0)
    ids = rng.integers(100, 30000, (1, 32)).tolist()
    body = orjson.dumps({"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [1, 32], "data": ids},
        {"name": "attention_mask", "datatype": "INT64", "shape": [1, 32], "data": [[1] * 32]},
    ]})
    return encode_http_request("POST", "/v2/models/minilm/infer", body,
                               {"Content-Type": "application/json"})


def _sample(pid: int, samples: list[int], stop: threading.Event) -> None:
    while not stop.wait(1.0):
        samples.append(procs.tree_rss_bytes(pid))


def _report(args: argparse.Namespace, result: object, samples: list[int], alive: bool,
            stats: dict[str, object]) -> None:
    from serval.loadtest.stats import StepResult

    assert isinstance(result, StepResult)
    refused = result.errors.get("http_429", 0)
    others = {k: v for k, v in result.errors.items() if k != "http_429"}
    peak = max(samples, default=0)
    print(f"{args.clients} clients for {args.duration:.0f} s on minilm "
          f"(max_queue_size {args.queue}, --default-timeout-ms {args.timeout_ms:.0f})")
    print(f"accepted (200): {result.requests:,} in the window, {result.throughput_rps:.0f} req/s, "
          f"p50 {result.p50_ms:.0f} ms, p99 {result.p99_ms:.0f} ms")
    print(f"refused (429): {refused:,}; other outcomes: {others or 'none'}")
    print(f"server RSS: first {samples[0] / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB "
          f"(bound {RSS_BOUND_BYTES / 2**20:.0f} MiB)" if samples else "no RSS samples")
    print(f"server statistics: {orjson.dumps(stats)[:400].decode()}")
    _verdict("server stayed up", alive)
    _verdict("every response 200 or 429", not others)
    _verdict(f"accepted p99 {result.p99_ms:.0f} ms within the {args.timeout_ms:.0f} ms timeout",
             result.p99_ms <= args.timeout_ms)
    _verdict(f"RSS peak {peak / 2**20:.0f} MiB under {RSS_BOUND_BYTES / 2**20:.0f} MiB",
             0 < peak < RSS_BOUND_BYTES)


def _verdict(goal: str, ok: bool) -> None:
    print(f"{'PASS' if ok else 'MISS'}: {goal}")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--clients", type=int, default=2000)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--queue", type=int, default=32, help="minilm's max_queue_size")
    parser.add_argument("--timeout-ms", type=float, default=2000.0)
    return parser.parse_args()


if __name__ == "__main__":
    main()
