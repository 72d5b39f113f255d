"""Hot-swap benchmark: publish new versions of `lstm` under load, lose nothing, slow down little.

Serves a copy of the example `lstm`, measures 64 clients for a steady phase, then publishes
--publishes new versions over --duration seconds (each written as a snapshot and loaded through
the repository API) while the same load runs. Reports failures, p99 during the swaps against
the steady p99, and the order in which an observer saw versions answer.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/hot_swap.py --repository examples/models
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers
from serval.loadtest.closed_loop import StepResult, run_closed_loop
from serval.loadtest.http_client import encode_http_request
from serval.repository import store


def main() -> None:
    args = _parse_args()
    repository = Path(tempfile.mkdtemp(prefix="serval-swap-"))
    source = args.repository / "lstm" / "1" / "model.onnx"
    store.publish(source, repository, "lstm", note="initial")
    shutil.copy(args.repository / "lstm" / "config.yaml", repository / "lstm" / "config.yaml")
    port = servers.free_port()
    command = [*servers.serval_command(repository, port, 1, 0), "--repository-api"]
    with servers.running(command, port,
                         "/v2/health/ready", repository / "server.log"):
        requests = _requests(port)
        steady = run_closed_loop(servers.HOST, port, requests, args.clients, args.steady, 2.0)
        observer = _VersionObserver(port)
        publisher = threading.Thread(target=_publish_versions,
                                     args=(source, repository, port, args))
        publisher.start()
        swapping = run_closed_loop(servers.HOST, port, requests, args.clients, args.duration, 0.0)
        publisher.join()
        observer.stop()
    _report(args, steady, swapping, observer)
    shutil.rmtree(repository, ignore_errors=True)


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--publishes", type=int, default=10)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--steady", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    return parser.parse_args()


def _requests(port: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    bodies = [orjson.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64",
                                        "shape": [1, 32],
                                        "data": rng.integers(0, 30000, 32).tolist()}]})
              for _ in range(16)]
    return [encode_http_request("POST", "/v2/models/lstm/infer", body,
                                {"Content-Type": "application/json"}, servers.HOST)
            for body in bodies]


def _publish_versions(source: Path, repository: Path, port: int,
                      args: argparse.Namespace) -> None:
    interval = args.duration / (args.publishes + 1)
    for step in range(args.publishes):
        time.sleep(interval)
        version = store.publish(source, repository, "lstm", note=f"swap {step + 1}")
        request = urllib.request.Request(
            f"http://{servers.HOST}:{port}/v2/repository/models/lstm/load", data=b"",
            method="POST")
        urllib.request.urlopen(request, timeout=120).read()
        print(f"  published and loaded version {version}", flush=True)


class _VersionObserver(threading.Thread):
    """One request every 20 ms on its own connection: which version answered, in order."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.url = f"http://{servers.HOST}:{port}/v2/models/lstm/infer"
        self.body = orjson.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64",
                                              "shape": [1, 32], "data": [1] * 32}]})
        self.versions: list[int] = []
        self.failures = 0
        self._halt = threading.Event()
        self.start()

    def run(self) -> None:
        while not self._halt.wait(0.02):
            try:
                request = urllib.request.Request(self.url, data=self.body, method="POST")
                with urllib.request.urlopen(request, timeout=30) as reply:
                    self.versions.append(int(orjson.loads(reply.read())["model_version"]))
            except OSError:
                self.failures += 1

    def stop(self) -> None:
        self._halt.set()
        self.join()


def _report(args: argparse.Namespace, steady: StepResult, swapping: StepResult,
            observer: _VersionObserver) -> None:
    steady_p99, swap_p99 = steady.p99_ms, swapping.p99_ms
    failed = swapping.failed + steady.failed + observer.failures
    forward = all(b >= a for a, b in zip(observer.versions, observer.versions[1:], strict=False))
    seen = sorted(set(observer.versions))
    print(f"steady @{args.clients}: {steady.throughput_rps:,.0f} req/s, p99 {steady_p99:.1f} ms")
    print(f"during {args.publishes} swaps: {swapping.throughput_rps:,.0f} req/s, "
          f"p99 {swap_p99:.1f} ms ({swap_p99 / steady_p99:.2f}x steady)")
    print(f"observer saw versions {seen[0]}..{seen[-1]} ({len(seen)} distinct) in "
          f"{len(observer.versions)} answers")
    for passed, text in [
        (failed == 0, f"zero failed requests ({failed})"),
        (swap_p99 <= 2 * steady_p99,
         f"p99 during swaps <= 2x steady ({swap_p99 / steady_p99:.2f}x)"),
        (forward, "model_version only moves forward"),
    ]:
        print(f"{'PASS' if passed else 'MISS'}  {text}")


if __name__ == "__main__":
    main()
