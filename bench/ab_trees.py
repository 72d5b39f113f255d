"""Two builds of Serval under the same load, alternated: what a change costs in throughput.

Each round starts the server from tree A and from tree B (its `src/` first on PYTHONPATH), A first
in even rounds and B first in odd ones (so neither always runs on the heels of the other), and
drives both with this tree's load generator: HTTP JSON, HTTP binary and gRPC unary (and stream),
`--concurrency` clients, one item per request. Rounds alternate so drift on a noisy box hits
both builds alike; the table gives each build's median over the rounds and B/A, for throughput
and for the server's CPU time per answered request (steadier than throughput on a shared box).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/ab_trees.py --a /path/to/before --b . --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers
from bench.workloads import grpc_requests, infer_requests, model_file, model_spec, random_feeds
from serval.loadtest.closed_loop import run_closed_loop
from serval.loadtest.grpc_closed_loop import run_grpc_closed_loop

console = Console(width=110)
MODES = ("http-json", "http-binary", "grpc-unary", "grpc-stream")


def main() -> None:
    args = _parse_args()
    logs = Path(tempfile.mkdtemp(prefix="serval-ab-"))
    args.repository = servers.only(args.repository, [args.model], logs)  # serve what is measured
    spec = model_spec(model_file(args.repository, args.model))
    feeds = random_feeds(spec, batch=1, count=16, seed=0)
    loads = {"http-json": infer_requests(args.model, feeds, False, servers.HOST),
             "http-binary": infer_requests(args.model, feeds, True, servers.HOST),
             "grpc": grpc_requests(args.model, feeds)}
    rates: dict[tuple[str, str], list[float]] = defaultdict(list)
    cpu: dict[tuple[str, str], list[float]] = defaultdict(list)
    for round_index in range(args.rounds):
        pair = (("A", args.a), ("B", args.b))
        for label, tree in pair if round_index % 2 == 0 else pair[::-1]:  # ABBA: no side first
            for mode, rate, cpu_us in _measure(args, tree, loads,
                                               logs / f"{label}{round_index}.log"):
                rates[(label, mode)].append(rate)
                cpu[(label, mode)].append(cpu_us)
                console.print(f"round {round_index + 1} {label} {mode:<12} {rate:>10,.0f} req/s"
                              f" {cpu_us:>7.1f} µs server CPU per request")
    _print(args, rates, cpu)


def _measure(args: argparse.Namespace, tree: Path, loads: dict[str, list[bytes]],
             log: Path) -> list[tuple[str, float, float]]:
    port, grpc_port = servers.free_ports(2)
    command = servers.serval_command(args.repository, port, 1, grpc_port)
    with servers.running(command, port, "/v2/health/ready", log, servers.tree_env(tree)):
        servers.get_json(port, f"/v2/models/{args.model}")
        pid = _server_pid(port)
        # a fresh server settles first (allocator, caches, the first batches' estimates),
        # so the first mode measured is not the one that pays for it
        run_closed_loop(servers.HOST, port, loads["http-binary"], args.concurrency,
                        args.settle, 0.0)
        out = []
        for mode in MODES:
            cpu_before_s = _cpu_s(pid)
            if mode.startswith("http"):
                result = run_closed_loop(servers.HOST, port, loads[mode], args.concurrency,
                                         args.duration, args.warmup)
            else:
                result = run_grpc_closed_loop(f"{servers.HOST}:{grpc_port}", loads["grpc"],
                                              args.concurrency, args.duration, args.warmup,
                                              processes=1, mode=mode.split("-")[1])
            if result.failed:
                console.print(f"[red]{mode}: {result.failed} failed requests[/]")
            answered = result.throughput_rps * args.duration
            cpu_us = (_cpu_s(pid) - cpu_before_s) * 1e6 / max(1.0, answered)
            out.append((mode, result.throughput_rps, cpu_us))
        return out


def _server_pid(port: int) -> int:
    """The serving process: the one whose command line names this port."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in argv and str(port).encode() in argv:
                return int(entry.name)
    raise RuntimeError(f"no server process on port {port}")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _print(args: argparse.Namespace, rates: dict[tuple[str, str], list[float]],
           cpu: dict[tuple[str, str], list[float]]) -> None:
    table = Table(title=f"{args.model}, {args.concurrency} clients, median of {args.rounds} "
                        f"rounds")
    for column in ("mode", "A req/s", "B req/s", "B/A", "A µs CPU", "B µs CPU", "B/A CPU"):
        table.add_column(column, justify="right" if column != "mode" else "left")
    for mode in MODES:
        a, b = statistics.median(rates[("A", mode)]), statistics.median(rates[("B", mode)])
        ca, cb = statistics.median(cpu[("A", mode)]), statistics.median(cpu[("B", mode)])
        table.add_row(mode, f"{a:,.0f}", f"{b:,.0f}", f"{b / a:.3f}", f"{ca:.1f}", f"{cb:.1f}",
                      f"{cb / ca:.3f}")
    console.print(table)
    console.print(f"A = {args.a}\nB = {args.b}")


def _parse_args() -> argparse.Namespace:
    parser = servers.two_trees_parser(__doc__)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=3.0,
                        help="unmeasured seconds of load on each fresh server")
    return parser.parse_args()


if __name__ == "__main__":
    main()
