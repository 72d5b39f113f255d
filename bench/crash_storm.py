"""A client that crashes a model's worker process on purpose, again and again: what the other
clients keep, and how many worker processes the server starts for it.

Serves a Python model in a worker process (`isolation: process`) that aborts on a negative
input, beside an ONNX model (bench/many_models.py's head). --clients keep-alive connections
infer on the ONNX model for --seconds, first alone, then while --attackers connections send
the aborting input as fast as answered. Prints, median of --rounds: the good clients' req/s in
both phases, their ratio, the server's CPU (its worker processes' included) and the workers
started during the storm (each start is a fresh Python process importing numpy and the model:
the CPU the attack costs). `--tree` serves
another checkout (the 'before' tree) for a before/after in one run.

    .venv/bin/python bench/crash_storm.py [--seconds 10] [--tree /tmp/before]
"""

from __future__ import annotations

import argparse
import functools
import http.client
import os
import statistics
import sys
import tempfile
import threading
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

CRASHY = """\
import os

import numpy as np


class Model:
    def load(self, ctx):
        pass

    def infer(self, inputs):
        if (inputs["x"] < 0).any():
            os.abort()
        return {"y": inputs["x"] * 2}
"""
CRASHY_CONFIG = """\
backend: python
isolation: process
max_batch_size: 8
inputs: [{name: x, datatype: FP32, dims: [4]}]
outputs: [{name: y, datatype: FP32, dims: [4]}]
"""
STARTED = "isolated model worker started"


def _server_pid(port: int) -> int:
    """The serving process: the one whose command line names --http-port `port`."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                words = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"--http-port" in words and words[words.index(b"--http-port") + 1] == \
                    str(port).encode():
                return int(entry.name)
    raise RuntimeError(f"no server on port {port}")


def _cpu_s(pid: int) -> float:
    """CPU seconds of the server, its reaped children and its live ones."""
    def fields(stat_pid: int | str) -> list[str]:
        text = Path(f"/proc/{stat_pid}/stat").read_text()
        return text[text.rindex(")") + 2:].split()

    ticks = os.sysconf("SC_CLK_TCK")
    mine = fields(pid)
    total = sum(int(value) for value in mine[11:15])  # utime stime cutime cstime
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                child = fields(entry.name)
            except OSError:
                continue
            if int(child[1]) == pid:  # its parent
                total += int(child[11]) + int(child[12])
    return total / ticks


def _loop(port: int, path: str, body: bytes, stop: threading.Event, statuses: list[int]
          ) -> None:
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    while not stop.is_set():
        connection.request("POST", path, body=body)
        reply = connection.getresponse()
        reply.read()
        statuses.append(reply.status)
    connection.close()


def _phase(port: int, clients: int, attackers: int, seconds: float) -> tuple[float, int]:
    """(good clients' req/s, attack requests answered) over one window."""
    good: list[list[int]] = [[] for _ in range(clients)]
    bad: list[list[int]] = [[] for _ in range(attackers)]
    good_body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, IN],
                                          "data": np.ones(IN, np.float32).tolist()}]})
    bad_body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                         "data": [-1.0] * 4}]})
    run_window([functools.partial(_loop, port, "/v2/models/tenant00000/infer", good_body,
                                  statuses=s) for s in good]
               + [functools.partial(_loop, port, "/v2/models/crashy/infer", bad_body,
                                    statuses=s) for s in bad], seconds)
    if any(status != 200 for statuses in good for status in statuses):
        raise RuntimeError("a good client's request failed")
    return sum(map(len, good)) / seconds, sum(map(len, bad))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--attackers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    add_tree_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "repository"
        _generate(root, 1)
        (root / "crashy" / "1").mkdir(parents=True)
        (root / "crashy" / "1" / "model.py").write_text(CRASHY)
        (root / "crashy" / "config.yaml").write_text(CRASHY_CONFIG)
        port, grpc_port = free_ports(2)
        log = Path(scratch) / "server.log"
        env = tree_env(args.tree) if args.tree else None
        command = [*serval_command(root, port, 1, grpc_port), "--allow-python-models",
                   "--log-level", "info"]
        alone, stormed, starts, answered, cpu_alone, cpu_storm = [], [], [], [], [], []
        with running(command, port, "/v2/health/ready", log, env):
            pid = _server_pid(port)
            for _ in range(args.rounds):
                cpu = _cpu_s(pid)
                alone.append(_phase(port, args.clients, 0, args.seconds)[0])
                cpu_alone.append(_cpu_s(pid) - cpu)
                before, cpu = log.read_text(errors="replace").count(STARTED), _cpu_s(pid)
                rate, attacks = _phase(port, args.clients, args.attackers, args.seconds)
                cpu_storm.append(_cpu_s(pid) - cpu)
                stormed.append(rate)
                answered.append(attacks)
                starts.append(log.read_text(errors="replace").count(STARTED) - before)
    print(f"{args.clients} good clients on an ONNX model, {args.attackers} attackers "
          f"crashing a Python worker, {args.seconds:.0f} s windows, median of {args.rounds}")
    alone_rate, storm_rate = statistics.median(alone), statistics.median(stormed)
    alone_cpu, storm_cpu = statistics.median(cpu_alone), statistics.median(cpu_storm)
    print(f"  alone:       {alone_rate:8.1f} req/s, server CPU "
          f"{alone_cpu / args.seconds:.2f} cores, {alone_cpu / alone_rate / args.seconds * 1e6:.0f}"
          " us per good request")
    print(f"  under storm: {storm_rate:8.1f} req/s ({storm_rate / alone_rate:.2f}x alone), "
          f"server CPU {storm_cpu / args.seconds:.2f} cores, "
          f"{storm_cpu / storm_rate / args.seconds * 1e6:.0f} us per good request")
    print(f"  attack requests answered {statistics.median(answered):.0f}, worker processes "
          f"started {statistics.median(starts):.0f} a window")


if __name__ == "__main__":
    main()
