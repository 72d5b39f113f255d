"""The response cache: what a hit saves and what a miss costs, in one run.

One model (default `minilm`, engine-bound) with `response_cache: true`, one item per binary
request, 64 clients; three servers take turns (off miss hit, off miss hit, ...):
  off    no --cache-config: the model runs for every request (all distinct)
  miss   --cache-config local,size=1GB, every request distinct: each is hashed, run and stored
  hit    --cache-config local,size=1GB, a pool of --hot requests sent round-robin: after the
         first pass every request is a hit
Prints each round (throughput, p50, the server's cache hits and misses), the median ratios
miss/off (the price of a miss: goal >= 0.95) and hit/off (what a hit buys).

    flock /tmp/serval-cpu.lock .venv/bin/python bench/response_cache.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers
from bench.workloads import infer_requests, model_file, model_spec, random_feeds
from serval.loadtest.closed_loop import StepResult, run_closed_loop

MISS_GOAL = 0.95
MODES = ("off", "miss", "hit")


def main() -> None:
    args = _parse_args()
    work = Path(tempfile.mkdtemp(prefix="serval-cache-bench-"))
    repository = _cached_repository(args.repository, args.model, work)
    spec = model_spec(model_file(args.repository, args.model))
    distinct = infer_requests(args.model, random_feeds(spec, 1, args.distinct, seed=1),
                              binary=True, host=servers.HOST)
    hot = distinct[:args.hot]
    results: dict[str, list[tuple[StepResult, int, int]]] = {mode: [] for mode in MODES}
    for round_index in range(args.rounds):
        for mode in MODES:
            measured = _measure(args, repository, mode, hot if mode == "hit" else distinct,
                                work / f"{mode}-{round_index}.log")
            results[mode].append(measured)
            result, hits, misses = measured
            print(f"round {round_index + 1} {mode:4s} {result.throughput_rps:9,.0f} req/s  "
                  f"p50 {result.p50_ms:6.2f} ms  cache hits {hits:,} misses {misses:,}  "
                  f"errors {result.failed}", flush=True)
    medians = {mode: statistics.median(r.throughput_rps for r, _, _ in rs)
               for mode, rs in results.items()}
    p50s = {mode: statistics.median(r.p50_ms for r, _, _ in rs) for mode, rs in results.items()}
    miss = medians["miss"] / medians["off"]
    print(f"{args.model}, {args.concurrency} clients, medians of {args.rounds}:")
    print(f"  {'PASS' if miss >= MISS_GOAL else 'MISS'} miss/off {miss:.2f} "
          f"({medians['miss']:,.0f} vs {medians['off']:,.0f} req/s; goal >= {MISS_GOAL})")
    print(f"  hit/off {medians['hit'] / medians['off']:.2f} ({medians['hit']:,.0f} req/s; "
          f"p50 {p50s['hit']:.2f} vs {p50s['off']:.2f} ms)")


def _cached_repository(source: Path, model: str, work: Path) -> Path:
    """A repository holding only `model` (its versions linked) with response_cache on."""
    folder = work / "repository" / model
    folder.mkdir(parents=True)
    original = source.resolve() / model
    for version in original.iterdir():
        if version.is_dir() and version.name.isdigit():
            (folder / version.name).symlink_to(version)
    config = (original / "config.yaml").read_text()
    (folder / "config.yaml").write_text(config.rstrip("\n") + "\nresponse_cache: true\n")
    return folder.parent


def _measure(args: argparse.Namespace, repository: Path, mode: str, requests: list[bytes],
             log: Path) -> tuple[StepResult, int, int]:
    port = servers.free_port()
    command = servers.serval_command(repository, port, 1, 0)
    if mode != "off":
        command += ["--cache-config", "local,size=1GB"]
    with servers.running(command, port, f"/v2/models/{args.model}/ready", log):
        result = run_closed_loop(servers.HOST, port, requests, args.concurrency,
                                 args.duration, args.warmup)
        stats = servers.get_json(port, f"/v2/models/{args.model}/stats")
    inference = stats["model_stats"][0]["inference_stats"]
    return result, inference["cache_hit"]["count"], inference["cache_miss"]["count"]


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--distinct", type=int, default=20_000,
                        help="distinct requests (more than a run sends: none repeats)")
    parser.add_argument("--hot", type=int, default=256, help="the hit mode's request pool")
    return parser.parse_args()


if __name__ == "__main__":
    main()
