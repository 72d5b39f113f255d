"""Chaos and soak: mixed load for --duration seconds while the repository and the processes change.

The server runs `--workers 2 --model-control lazy` under a small `--memory-budget` and polls the
repository. Load: closed-loop clients cycling through `mlp`, eight tenant copies of it (one model
more than the budget holds, so models are evicted and reloaded all the time) and metadata,
statistics and readiness reads. Meanwhile:
- a new `mlp` version is published (`serval repo publish`) every tenth of the run;
- at 40% one worker process is SIGKILLed (the injected fault; the supervisor restarts it);
- at 55% a corrupt version folder is dropped into `mlp` (refused; the old one keeps serving).
The load runs in segments, so each segment's outcomes are attributed to what happened in it.
Reports requests by outcome, 5xx, RSS over time (summed over the server's processes) and RSS
growth after warm-up, with PASS/MISS against the goals.

    .venv/bin/python bench/chaos.py --repository examples/models [--duration 600]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import procs, servers
from serval.backends.onnxruntime import SESSION_OVERHEAD_BYTES
from serval.loadtest.closed_loop import run_closed_loop
from serval.loadtest.http_client import encode_http_request
from serval.repository import store
from serval.repository.layout import version_bytes

TENANTS = 8
SEGMENT_S = 10.0
RSS_GROWTH_GOAL = 0.05


@dataclass
class Timeline:
    """What the chaos thread did, when (seconds since the load started)."""

    events: list[tuple[float, str]] = field(default_factory=list)
    killed_at: float | None = None
    probe_errors: Counter[str] = field(default_factory=Counter)  # non-200 bodies a probe saw
    rss: list[tuple[float, int, int]] = field(default_factory=list)  # t, tree, survivor


def main() -> None:
    args = _parse_args()
    procs.raise_open_files_limit()
    root = Path(tempfile.mkdtemp(prefix="serval-chaos-"))
    budget_kib = _build_repository(args.repository, root)
    port = servers.free_port()
    command = [*servers.serval_command(root, port, 2, 0), "--model-control", "lazy",
               "--memory-budget", f"{budget_kib}KiB", "--poll-interval-s", "1"]
    print(f"serving {root} with --workers 2 --model-control lazy --memory-budget "
          f"{budget_kib}KiB ({TENANTS} of the {TENANTS + 1} models fit)")
    with servers.running(command, port, "/v2/health/ready", root / "server.log"):
        parent = procs.server_pid(port)
        _wait_for_workers(parent, 2)
        outcomes, segments = _run(args, root, port, parent)
        evictions = _metric(port, "serval_model_evictions_total")
    log_text = (root / "server.log").read_text(errors="replace")
    if _report(args, outcomes, segments, evictions, log_text):
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"server log kept: {root / 'server.log'}")


def _build_repository(examples: Path, root: Path) -> int:
    """mlp (published snapshots) and TENANTS copies; returns a budget (KiB) for TENANTS of them.

    With at most `clients` (= TENANTS) requests pinning models, a load always finds an idle
    model to evict, so evictions never have to refuse a request.
    """
    mlp_file = examples / "mlp" / "1" / "model.onnx"
    store.publish(mlp_file, root, "mlp", note="initial")
    for index in range(TENANTS):
        (root / f"tenant{index}" / "1").mkdir(parents=True)
        shutil.copy(mlp_file, root / f"tenant{index}" / "1" / "model.onnx")
        (root / f"tenant{index}" / "config.yaml").write_text("max_batch_size: 64\n")
    slot_kib = (version_bytes(root / "mlp" / "1") + SESSION_OVERHEAD_BYTES) / 1024 + 8
    return int(slot_kib * TENANTS + slot_kib / 2)


def _requests() -> list[bytes]:
    rng = np.random.default_rng(0)
    mlp = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 256],
                                    "data": rng.random(256).round(4).tolist()}]})
    headers = {"Content-Type": "application/json"}
    mix = [encode_http_request("POST", "/v2/models/mlp/infer", mlp, headers)] * 4
    mix += [encode_http_request("POST", f"/v2/models/tenant{i}/infer", mlp, headers)
            for i in range(TENANTS)]
    mix += [encode_http_request("GET", "/v2/models/mlp"),
            encode_http_request("GET", "/v2/models/stats"),
            encode_http_request("GET", "/v2/health/ready")]
    return mix


def _run(args: argparse.Namespace, root: Path, port: int, parent: int
         ) -> tuple[Counter[str], list[tuple[float, float, dict[str, int], int]]]:
    timeline = Timeline()
    started = time.monotonic()
    stop = threading.Event()
    chaos = threading.Thread(target=_chaos, args=(args, root, parent, timeline, started, stop),
                             daemon=True)
    chaos.start()
    probe = threading.Thread(target=_probe, args=(port, timeline, stop), daemon=True)
    probe.start()
    totals: Counter[str] = Counter()
    segments = []
    requests = _requests()
    while (now := time.monotonic() - started) < args.duration:
        length = min(SEGMENT_S, args.duration - now)
        if length < 1:
            break
        result = run_closed_loop(servers.HOST, port, requests, args.clients, length,
                                 warmup_s=0.0, timeout_s=30.0)
        served = result.requests
        totals["http_200"] += served
        totals.update(result.errors)
        segments.append((now, now + length, dict(result.errors), served))
    stop.set()
    chaos.join(timeout=30)
    args.timeline = timeline
    return totals, segments


def _chaos(args: argparse.Namespace, root: Path, parent: int, timeline: Timeline,
           started: float, stop: threading.Event) -> None:
    duration = args.duration
    publishes = [duration * (i + 1) / 10 for i in range(9)]
    kill_at, corrupt_at = duration * 0.40, duration * 0.55
    survivor: int | None = None
    done_kill = done_corrupt = False
    next_rss = 0.0
    while not stop.wait(0.2):
        now = time.monotonic() - started
        if now >= next_rss:
            workers = [p for p in procs.children(parent) if procs.is_serving_worker(p)]
            if survivor is None and len(workers) == 2:
                survivor = max(workers)  # the one never killed
            timeline.rss.append((now, procs.tree_rss_bytes(parent),
                                 procs.rss_bytes(survivor) if survivor else 0))
            next_rss = now + 2.0
        if publishes and now >= publishes[0]:
            publishes.pop(0)
            version = store.publish(root / "mlp" / "1" / "model.onnx", root, "mlp",
                                    note="chaos publish")
            timeline.events.append((now, f"published mlp version {version}"))
        if not done_kill and now >= kill_at and survivor is not None:
            victim = min(p for p in procs.children(parent) if procs.is_serving_worker(p)
                         and p != survivor)
            os.kill(victim, signal.SIGKILL)
            timeline.killed_at, done_kill = now, True
            timeline.events.append((now, f"SIGKILL worker {victim}"))
        if not done_corrupt and now >= corrupt_at:
            version = _drop_corrupt_version(root / "mlp")
            done_corrupt = True
            timeline.events.append((now, f"corrupt version {version} dropped into mlp"))


def _probe(port: int, timeline: Timeline, stop: threading.Event) -> None:
    """A slow side client across the models that keeps the body of every non-200 answer."""
    import urllib.error
    import urllib.request

    body = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 256],
                                     "data": [0.1] * 256}]})
    index = 0
    while not stop.wait(0.05):
        model = "mlp" if index % (TENANTS + 1) == TENANTS else f"tenant{index % TENANTS}"
        index += 1
        url = f"http://{servers.HOST}:{port}/v2/models/{model}/infer"
        try:
            urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30).read()
        except urllib.error.HTTPError as exc:
            timeline.probe_errors[f"{exc.code} {exc.read()[:160].decode(errors='replace')}"] += 1
        except OSError as exc:
            timeline.probe_errors[f"{type(exc).__name__}"] += 1


def _drop_corrupt_version(model_dir: Path) -> str:
    """A garbage model.onnx in the next version folder (written aside, renamed into place)."""
    version = str(max(int(p.name) for p in model_dir.iterdir() if p.name.isdigit()) + 1)
    staging = model_dir / ".incoming"
    staging.mkdir()
    (staging / "model.onnx").write_bytes(b"\x08\x07garbage, not an ONNX graph" * 100)
    staging.rename(model_dir / version)
    return version


def _wait_for_workers(parent: int, count: int) -> None:
    deadline = time.monotonic() + 60
    while len([p for p in procs.children(parent) if procs.is_serving_worker(p)]) < count:
        if time.monotonic() > deadline:
            raise RuntimeError("workers did not start")
        time.sleep(0.2)
    time.sleep(3.0)  # both load lazily; let the second finish binding


def _metric(port: int, name: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://{servers.HOST}:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def _report(args: argparse.Namespace, totals: Counter[str],
            segments: list[tuple[float, float, dict[str, int], int]], evictions: float,
            log_text: str) -> bool:
    """Print the figures and verdicts; True when every goal is met."""
    timeline: Timeline = args.timeline
    killed_at = timeline.killed_at
    injected: Counter[str] = Counter()
    other: Counter[str] = Counter()
    for start, end, errors, _ in segments:
        in_kill = killed_at is not None and start <= killed_at + 2 < end + SEGMENT_S
        for key, count in errors.items():
            (injected if in_kill and key in ("connection", "timeout") else other)[key] += count
    print(f"{args.clients} clients for {args.duration:.0f} s in {len(segments)} segments")
    for when, what in timeline.events:
        print(f"  t={when:6.1f} s  {what}")
    print(f"outcomes: {dict(sorted(totals.items()))}")
    print(f"failures attributed to the worker kill (injected): {dict(injected) or 'none'}")
    print(f"other failures: {dict(other) or 'none'}")
    for start, end, errors, served in segments:
        if errors:
            print(f"  t={start:5.0f}-{end:5.0f} s: {served} ok, {errors}")
    for text, count in timeline.probe_errors.most_common(4):
        print(f"  probe saw {count}x: {text}")
    five_xx = sum(n for k, n in other.items() if k.startswith("http_5"))
    print(f"model evictions (surviving worker's counter): {evictions:.0f}; "
          f"worker restarts in the log: {log_text.count('worker process died; restarting it')}; "
          f"corrupt version refused: {'model failed to load' in log_text}")
    growth_tree, growth_survivor = _rss_report(timeline.rss, args.duration)
    lost = other.get("timeout", 0) + other.get("connection", 0)
    return all([
        _verdict(f"zero 5xx other than injected ({five_xx})", five_xx == 0),
        _verdict(f"no accepted request lost ({lost} timeouts/broken connections outside the "
                 "kill)", lost == 0 and not other),
        _verdict(f"RSS growth after warm-up ≤ 5% (all processes {growth_tree:+.1%}, "
                 f"surviving worker {growth_survivor:+.1%})",
                 growth_tree <= RSS_GROWTH_GOAL and growth_survivor <= RSS_GROWTH_GOAL),
    ])


def _rss_report(rss: list[tuple[float, int, int]], duration: float) -> tuple[float, float]:
    """Print RSS over time; growth = median of the last tenth vs the tenth after warm-up."""
    step = max(1, len(rss) // 12)
    print("RSS over time (all server processes / surviving worker), MiB:")
    print("  " + "  ".join(f"t={t:.0f}:{tree / 2**20:.0f}/{mine / 2**20:.0f}"
                           for t, tree, mine in rss[::step]))
    warm_from, window = duration * 0.25, duration * 0.10
    early = [(tree, mine) for t, tree, mine in rss if warm_from <= t < warm_from + window]
    late = [(tree, mine) for t, tree, mine in rss if t >= duration - window]
    if not early or not late:
        return float("nan"), float("nan")
    growth = []
    for column in (0, 1):
        before = statistics.median(x[column] for x in early)
        after = statistics.median(x[column] for x in late)
        growth.append(after / before - 1)
        print(f"  {'all processes' if column == 0 else 'surviving worker'}: "
              f"{before / 2**20:.0f} MiB after warm-up -> {after / 2**20:.0f} MiB at the end")
    return growth[0], growth[1]


def _verdict(goal: str, ok: bool) -> bool:
    print(f"{'PASS' if ok else 'MISS'}: {goal}")
    return ok


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--clients", type=int, default=TENANTS,
                        help="closed-loop clients (more than TENANTS may pin every model)")
    return parser.parse_args()


if __name__ == "__main__":
    main()
