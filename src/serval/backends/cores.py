"""How many cores this process may really use: CPU affinity, capped by a cgroup CPU quota.

A container limited to 2 CPUs on a 64-core host sees 64 in os.cpu_count() and in its affinity
mask; sizing engine threads from that oversubscribes it 32 times (threads preempt each other at
every quota period). The quota is read from cgroup v2 (`cpu.max`) or v1 (`cpu.cfs_quota_us` /
`cpu.cfs_period_us`) along this process's own cgroup path, the tightest level winning.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cores(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup"),
                 affinity: int | None = None) -> int:
    """min(affinity, ceil(quota / period)) over the cgroup hierarchy; at least 1."""
    cores = affinity if affinity is not None else _affinity()
    quota = cgroup_quota(cgroup_root, proc_cgroup)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota - 1e-9)))
    return max(1, cores)


def cgroup_quota(cgroup_root: Path = CGROUP_ROOT,
                 proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The tightest CPU quota (in cores) on this process's cgroup path, or None if unlimited."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # cgroup v2 unified hierarchy
            quotas += _v2_quotas(cgroup_root, path)
        elif "cpu" in controllers.split(","):
            quotas += _v1_quotas(cgroup_root / controllers, path)
    return min(quotas) if quotas else None


def _ancestors(base: Path, path: str) -> list[Path]:
    """base/path and each of its parents up to base itself (a quota at any level applies)."""
    parts = [p for p in path.strip("/").split("/") if p and p != ".."]
    return [base.joinpath(*parts[:depth]) for depth in range(len(parts), -1, -1)]


def _v2_quotas(root: Path, path: str) -> list[float]:
    found = []
    for folder in _ancestors(root, path):
        text = _read(folder / "cpu.max")
        if text is None:
            continue
        fields = text.split()
        if len(fields) == 2 and fields[0] != "max":
            found.append(_ratio(fields[0], fields[1]))
    return [q for q in found if q > 0]


def _v1_quotas(root: Path, path: str) -> list[float]:
    found = []
    for folder in _ancestors(root, path):
        quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
        if quota is not None and period is not None and quota.strip() != "-1":
            found.append(_ratio(quota, period))
    return [q for q in found if q > 0]


def _ratio(quota: str, period: str) -> float:
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return 0.0


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
