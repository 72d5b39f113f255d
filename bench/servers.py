"""Start and stop the servers under test as subprocesses on free loopback ports."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from serval.loadtest.server_process import DIRECT, HOST, running
from serval.ports import free_port, free_ports

__all__ = [
    "HOST",
    "add_tree_option",
    "fastapi_command",
    "free_port",
    "free_ports",
    "get_json",
    "run_window",
    "running",
    "serval_command",
    "tree_env",
    "trivial_command",
    "two_trees_parser",
]


def serval_command(repository: Path, port: int, workers: int, grpc_port: int) -> list[str]:
    command = [sys.executable, "-m", "serval", "serve", "--repository", str(repository),
               "--host", HOST, "--http-port", str(port), "--grpc-port", str(grpc_port),
               "--workers", str(workers), "--log-level", "warning"]
    # the benches measure what more workers do, engine-bound models included
    return [*command, "--force-workers"] if workers > 1 else command


def only(repository: Path, models: list[str], where: Path) -> Path:
    """A repository under `where` holding only `models` (symlinks): each bench serves what it
    measures, no other engine beside it, and no Python model asking for --allow-python-models."""
    root = where / f"repository-{'-'.join(models)}"
    root.mkdir(exist_ok=True)
    for model in models:
        if not (root / model).exists():
            (root / model).symlink_to((repository / model).resolve())
    return root


def add_tree_option(parser: argparse.ArgumentParser) -> None:
    """--tree: the benches that serve one checkout at a time, run again on the 'before' one."""
    parser.add_argument("--tree", type=Path, default=None,
                        help="serve from another checkout's src/ (e.g. the 'before' tree)")


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that makes a child run another checkout's serval (its src/ on the path)."""
    return {"PYTHONPATH": str(tree.resolve() / "src")}


def two_trees_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every bench comparing two checkouts takes: the trees, the repository and
    the model served."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--a", type=Path, required=True, help="the 'before' source tree")
    parser.add_argument("--b", type=Path, default=Path("."), help="the 'after' source tree")
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--model", default="mlp")
    return parser


def fastapi_command(repository: Path, port: int) -> list[str]:
    script = Path(__file__).with_name("baseline_fastapi.py")
    return [sys.executable, str(script), "--repository", str(repository), "--port", str(port)]


def trivial_command(port: int) -> list[str]:
    return [sys.executable, str(Path(__file__).with_name("trivial_server.py")), "--port", str(port)]


def get_json(port: int, path: str) -> dict:
    with DIRECT.open(f"http://{HOST}:{port}{path}", timeout=10) as reply:
        return dict(orjson.loads(reply.read()))


_ENGINE_TIMES = ("compute_input", "compute_infer", "compute_output")


def engine_totals(port: int, model: str) -> dict[str, int]:
    """A model's running engine totals from its Triton-style statistics, over its versions:
    executions, items, and the nanoseconds spent forming inputs, inferring and splitting outputs
    (with several workers, those of the one worker that answered)."""
    totals = dict.fromkeys(("executions", "items", *_ENGINE_TIMES), 0)
    for stats in get_json(port, f"/v2/models/{model}/stats")["model_stats"]:
        totals["executions"] += int(stats.get("execution_count", 0))
        totals["items"] += int(stats.get("inference_count", 0))
        for name in _ENGINE_TIMES:
            totals[name] += int(stats.get("inference_stats", {}).get(name, {}).get("ns", 0))
    return totals


def engine_use(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    """Between two engine_totals: the mean batch and the engine's milliseconds per batch."""
    runs = max(1, after["executions"] - before["executions"])
    return {"mean_batch": (after["items"] - before["items"]) / runs,
            **{f"{name.removeprefix('compute_')}_ms": (after[name] - before[name]) / runs / 1e6
               for name in _ENGINE_TIMES}}


def run_window(loops: list[Callable[[threading.Event], None]], seconds: float) -> None:
    """Each loop on a thread of its own for `seconds` (the measured window), then told to stop
    (the event it is given) and joined."""
    stop = threading.Event()
    threads = [threading.Thread(target=loop, args=(stop,)) for loop in loops]
    for thread in threads:
        thread.start()
    time.sleep(seconds)  # the measured window itself
    stop.set()
    for thread in threads:
        thread.join()
