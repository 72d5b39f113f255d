"""Triton Python-backend models with instance_group count 1 vs N: requests per second.

A model whose execute() is pure Python (it holds the GIL: a loop of --work iterations per
request) is served with count 1 and count N from one repository; --clients threads call each
over keep-alive HTTP for --seconds, in rounds that alternate the two; the median of the rounds
is printed with the ratio. Before every instance had its own worker process the ratio was ~1.0
(one process ran the batches one after another); N processes on N free cores approach N.

    .venv/bin/python bench/python_instances.py [--count 2] [--clients 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.servers import HOST, add_tree_option, free_ports, running, serval_command, tree_env

MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            total = 0
            for i in range({work}):
                total += i * i
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([total % 1000], np.int32))]))
        return responses
'''

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN", data_type: TYPE_INT32, dims: [ 1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
"""

BODY = orjson.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1],
                                 "data": [1]}]})


def _write(root: Path, name: str, count: int, work: int) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(MODEL.format(work=work))
    (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, count=count))


def _rate(port: int, model: str, clients: int, seconds: float) -> float:
    """Requests per second from `clients` threads, each on its own keep-alive connection."""
    done = [0] * clients
    stop = threading.Event()

    def client(index: int) -> None:
        connection = http.client.HTTPConnection(HOST, port, timeout=60)
        while not stop.is_set():
            connection.request("POST", f"/v2/models/{model}/infer", body=BODY)
            reply = connection.getresponse()
            reply.read()
            if reply.status != 200:
                raise RuntimeError(f"{model}: HTTP {reply.status}")
            done[index] += 1
        connection.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    time.sleep(seconds)  # the measured window itself
    stop.set()
    for thread in threads:
        thread.join()
    return sum(done) / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--work", type=int, default=100_000, help="loop iterations per request")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    add_tree_option(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / "repository"
        _write(root, "one", 1, args.work)
        _write(root, "many", args.count, args.work)
        port, grpc_port = free_ports(2)
        command = [*serval_command(root, port, 1, grpc_port), "--allow-python-models"]
        env = tree_env(args.tree) if args.tree else None
        with running(command, port, "/v2/health/ready", Path(scratch) / "server.log", env):
            for model in ("one", "many"):  # loaded (and warmed) before any round
                _rate(port, model, 1, 0.5)
            rates: dict[str, list[float]] = {"one": [], "many": []}
            for _ in range(args.rounds):
                for model in ("one", "many"):
                    rates[model].append(_rate(port, model, args.clients, args.seconds))
    one, many = statistics.median(rates["one"]), statistics.median(rates["many"])
    print(f"pure-Python execute(), {args.work} iterations a request, {args.clients} clients, "
          f"median of {args.rounds} rounds")
    print(f"  count 1: {one:8.1f} req/s   rounds {[round(r) for r in rates['one']]}")
    print(f"  count {args.count}: {many:8.1f} req/s   rounds {[round(r) for r in rates['many']]}")
    print(f"  count {args.count} / count 1: {many / one:.2f}x")


if __name__ == "__main__":
    main()
