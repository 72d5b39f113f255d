"""Two builds of Serval, counted in CPU instructions per request: what a change costs, steadily.

Throughput on a shared box drifts by 15-25% between minutes, far more than the few percent a
change to the request path costs. Instructions drift far less: each build serves under valgrind
(`cachegrind`, no cache simulation), once for `--base` requests and once for `--base` +
`--requests`, and the difference over `--requests` is what one request costs the whole server
process (parsing, limits, batching, the engine, the answer). Start-up cancels out.

Requests go one at a time per client over keep-alive connections (HTTP/1.1, gRPC unary and
one ModelStreamInfer stream per client), so every request makes the same trip through the
server; more than one client lets batches form. One count repeats to within 2-5% here (the
batcher's decisions and the loop's timers still follow the clock): take the median of repeats.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/instructions.py --a /path/to/before --b . \
        [--concurrency 1,16] [--json-out docs/results/instructions.json]

Needs valgrind (Debian: `apt-get install valgrind`); a build runs some 50x slower under it.
"""

from __future__ import annotations

import argparse
import queue
import re
import shutil
import socket
import statistics
import sys
import tempfile
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers
from bench.procs import cpu_features
from bench.workloads import grpc_requests, infer_requests, model_file, model_spec, random_feeds
from serval.loadtest.grpc_closed_loop import MODEL_INFER, MODEL_STREAM_INFER

console = Console(width=100)
MODES = ("http-json", "http-binary", "grpc-unary", "grpc-stream")
VALGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]


def main() -> None:
    args = _parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    logs = Path(tempfile.mkdtemp(prefix="serval-instr-"))
    args.repository = servers.only(args.repository, [args.model], logs)
    spec = model_spec(model_file(args.repository, args.model))
    feeds = random_feeds(spec, batch=1, count=16, seed=0)
    grpc = grpc_requests(args.model, feeds)
    loads = {"http-json": infer_requests(args.model, feeds, False, servers.HOST),
             "http-binary": infer_requests(args.model, feeds, True, servers.HOST),
             "grpc-unary": grpc, "grpc-stream": grpc}
    runs = []
    for concurrency in args.concurrency:
        per_request: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for repeat in range(args.repeats):
            for mode in args.modes:
                pair = (("A", args.a), ("B", args.b))
                for label, tree in pair if repeat % 2 == 0 else pair[::-1]:  # neither first
                    counts = [_count(args, tree, mode, loads[mode], n, concurrency,
                                     logs / f"{label}-{mode}-{concurrency}-{n}")
                              for n in (args.base, args.base + args.requests)]
                    cost = (counts[1] - counts[0]) / args.requests
                    per_request[mode][label].append(cost)
                    console.print(f"{concurrency} clients, repeat {repeat + 1}: {label} "
                                  f"{mode:<12} {cost:>10,.0f} instructions per request")
        runs.append({"concurrency": concurrency, "per_request": per_request})
        _print(args, concurrency, per_request)
    console.print(f"A = {args.a} ({args.a_name})\nB = {args.b} ({args.b_name})")
    if args.json_out:
        args.json_out.write_bytes(orjson.dumps({
            "cpu": cpu_features(), "model": args.model, "a": args.a_name, "b": args.b_name,
            "requests": args.requests, "base": args.base, "repeats": args.repeats,
            "runs": runs}, option=orjson.OPT_INDENT_2))


def _count(args: argparse.Namespace, tree: Path, mode: str, requests: list[bytes], total: int,
           concurrency: int, stem: Path) -> int:
    """Instructions the server process ran from start to exit, having answered `total`."""
    port, grpc_port = servers.free_ports(2)
    valgrind_log = stem.with_suffix(".valgrind")
    command = [*VALGRIND, f"--log-file={valgrind_log}",
               *servers.serval_command(args.repository, port, 1, grpc_port)]
    env = {**servers.tree_env(tree), "PYTHONHASHSEED": "0"}
    with servers.running(command, port, f"/v2/models/{args.model}/ready",
                         stem.with_suffix(".log"), env):
        send = _http if mode.startswith("http") else _grpc(mode.split("-")[1])
        target = port if mode.startswith("http") else grpc_port
        _drive(send, target, requests, total, concurrency)
    found = re.search(r"I\s+refs:\s+([\d,]+)", valgrind_log.read_text())
    if found is None:
        raise RuntimeError(f"no instruction count in {valgrind_log}")
    return int(found.group(1).replace(",", ""))


def _drive(send: Callable[[int, list[bytes], int], None], port: int, requests: list[bytes],
           total: int, concurrency: int) -> None:
    shares = [total // concurrency + (i < total % concurrency) for i in range(concurrency)]
    errors: list[BaseException] = []

    def client(count: int) -> None:
        try:
            send(port, requests, count)
        except BaseException as exc:  # reported below: a failed request spoils the count
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"{len(errors)} clients failed: {errors[0]!r}")


def _http(port: int, requests: list[bytes], count: int) -> None:
    with socket.create_connection((servers.HOST, port)) as sock, sock.makefile("rb") as reader:
        for i in range(count):
            sock.sendall(requests[i % len(requests)])
            status = reader.readline()
            if b" 200 " not in status:
                raise RuntimeError(f"answered {status!r}")
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            reader.read(length)


def _grpc(kind: str) -> Callable[[int, list[bytes], int], None]:
    import grpc

    def unary(port: int, requests: list[bytes], count: int) -> None:
        with grpc.insecure_channel(f"{servers.HOST}:{port}") as channel:
            call = channel.unary_unary(MODEL_INFER)
            for i in range(count):
                call(requests[i % len(requests)], timeout=60)

    def stream(port: int, requests: list[bytes], count: int) -> None:
        outbox: queue.Queue[bytes | None] = queue.Queue()

        def messages() -> Iterator[bytes]:
            while (message := outbox.get()) is not None:
                yield message

        with grpc.insecure_channel(f"{servers.HOST}:{port}") as channel:
            outbox.put(requests[0])
            answers = channel.stream_stream(MODEL_STREAM_INFER)(messages(), timeout=600)
            for i, answer in enumerate(answers, start=1):
                if answer[:1] == b"\n":  # field 1 set: error_message, not infer_response
                    raise RuntimeError(f"stream answered an error: {answer[2:80]!r}")
                if i == count:
                    break
                outbox.put(requests[i % len(requests)])
            outbox.put(None)

    return unary if kind == "unary" else stream


def _print(args: argparse.Namespace, concurrency: int,
           per_request: dict[str, dict[str, list[float]]]) -> None:
    clients = f"{concurrency} client{'s' if concurrency > 1 else ''}"
    table = Table(title=f"{args.model}, {clients}, instructions per request "
                        f"(median of {args.repeats})")
    for column in ("mode", "A", "B", "B/A"):
        table.add_column(column, justify="right" if column != "mode" else "left")
    for mode, counts in per_request.items():
        a, b = statistics.median(counts["A"]), statistics.median(counts["B"])
        table.add_row(mode, f"{a:,.0f}", f"{b:,.0f}", f"{b / a:.3f}")
    console.print(table)


def _parse_args() -> argparse.Namespace:
    parser = servers.two_trees_parser(__doc__)
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES),
                        help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--a-name", default="A", help="how the results name tree A")
    parser.add_argument("--b-name", default="B", help="how the results name tree B")
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")],
                        default=[16], help="clients, comma-separated for several runs")
    parser.add_argument("--requests", type=int, default=6000,
                        help="requests counted (the difference between the two runs)")
    parser.add_argument("--base", type=int, default=200, help="requests of the shorter run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json-out", type=Path, default=None,
                        help="write the counts here (docs/results/instructions.json)")
    args = parser.parse_args()
    if min(args.concurrency) < 1 or args.requests < 1 or args.base < 1 or args.repeats < 1:
        parser.error("--concurrency, --requests, --base and --repeats must be >= 1")
    unknown = set(args.modes) - set(MODES)
    if unknown:
        parser.error(f"unknown mode {', '.join(sorted(unknown))}; choose from {', '.join(MODES)}")
    return args


if __name__ == "__main__":
    main()
