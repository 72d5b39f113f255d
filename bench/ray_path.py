"""Serval's data plane behind Ray Serve's HTTP proxy (with or without the Serval ingress), one
replica, for bench/cluster.py --ray (every Ray process in one cgroup capped at the HAProxy
cluster's CPU) and bench/ray_serve.py (the whole box)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from serval.cluster.cpu import CGROUP_ROOT, PERIOD_US
from serval.loadtest.closed_loop import run_closed_loop
from serval.loadtest.stats import StepResult
from serval.ports import free_port

HOST = "127.0.0.1"
OBJECT_STORE_BYTES = 100 * 1024 * 1024


def ray_lstm(repo: Path, requests: list[bytes], clients: int, duration_s: float,
             quota_cpus: float) -> StepResult:
    """`lstm` requests at `clients` through Ray Serve (proxy + ingress + one replica)."""
    with ray_serval(repo, quota_cpus, ingress=True) as port:
        run_closed_loop(HOST, port, requests, clients, 3.0, 1.0)  # warm the path
        return run_closed_loop(HOST, port, requests, clients, duration_s, 2.0)


@contextlib.contextmanager
def ray_serval(repo: Path, quota_cpus: float | None, ingress: bool) -> Iterator[int]:
    """Serval's Ray Serve application over `repo` (one replica), its HTTP port yielded; Ray's
    processes capped at quota_cpus in a cgroup (None: the whole box). With ingress False the
    requests must carry `serve_multiplexed_model_id` (see `multiplexed`)."""
    from ray import serve

    from serval.cluster.ray import build_app

    port = free_port()
    cgroup = (_in_cgroup(quota_cpus) if quota_cpus is not None
              else contextlib.nullcontext(lambda: None))
    with cgroup as leave, _ray(num_cpus=2, port=port):
        serve.run(build_app({"repository": str(repo), "num_replicas": 1, "replica_cpus": 1,
                             "max_ongoing_requests": 256, "poll_interval_s": 0,
                             "ingress": ingress}),
                  name="serval", route_prefix="/")
        leave()  # Ray's processes stay capped; the load generator leaves the cgroup
        try:
            yield port
        finally:
            serve.delete("serval")


def multiplexed(requests: list[bytes], model: str) -> list[bytes]:
    """The same HTTP/1.1 requests with the header Ray's proxy places by (ingress: false)."""
    header = f"serve_multiplexed_model_id: {model}\r\n".encode("latin-1")
    placed = []
    for request in requests:
        line, crlf, rest = request.partition(b"\r\n")
        placed.append(line + crlf + header + rest)
    return placed


@contextlib.contextmanager
def _in_cgroup(quota_cpus: float) -> Iterator[Callable[[], None]]:
    """This process joins a cgroup v1 `cpu` group capped at quota_cpus, so that what it starts
    (Ray's processes) is capped too; yields a function that moves this process back out."""
    root = CGROUP_ROOT / "cpu"
    group = root / f"serval-benchcl-ray-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
    (group / "cpu.cfs_quota_us").write_text(str(int(quota_cpus * PERIOD_US)))
    (group / "cgroup.procs").write_text(str(os.getpid()))

    def leave() -> None:
        (root / "cgroup.procs").write_text(str(os.getpid()))

    try:
        yield leave
    finally:
        leave()
        # Ray's processes are gone once _ray() has shut down; then the group can go
        with contextlib.suppress(OSError):
            group.rmdir()


@contextlib.contextmanager
def _ray(num_cpus: int, port: int) -> Iterator[None]:
    """A local single-node Ray, Serve's HTTP on `port`; always shut down."""
    import ray
    from ray import serve

    ray.init(num_cpus=num_cpus, object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False,
             logging_level=logging.WARNING, log_to_driver=False)
    try:
        serve.start(http_options={"host": HOST, "port": port})
        yield
    finally:
        serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
