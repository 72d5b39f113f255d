"""Each local node's share of the machine: its cores (affinity) and, when asked, a CPU quota
in its own cgroup (v1 `cpu` controller or v2 `cpu.max`), so N nodes on one box behave like N
smaller machines."""

from __future__ import annotations

import contextlib
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


@dataclass(frozen=True)
class CpuShare:
    """Cores a node may run on, and its quota in CPUs (None: no quota)."""

    cores: tuple[int, ...]
    quota_cpus: float | None = None
    cgroup: Path | None = None

    def enter(self) -> None:
        """Run in the child before exec: pin to the cores, join the cgroup."""
        os.sched_setaffinity(0, self.cores)
        if self.cgroup is not None:
            (self.cgroup / "cgroup.procs").write_text(str(os.getpid()))

    def release(self) -> None:
        """Remove the (now empty) cgroup."""
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.rmdir()


def machine_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def plan_shares(nodes: int, quota_cpus: float | None, prefix: str) -> list[CpuShare]:
    """Split this process's cores among `nodes`: contiguous groups when there are enough
    cores, round robin otherwise; with a quota, each node gets ceil(quota) cores and a
    cgroup capping it at `quota_cpus` (skipped with a warning where cgroups are read-only)."""
    cores = machine_cores()
    if quota_cpus is not None and quota_cpus <= 0:
        raise ValueError("a node's CPU quota must be > 0")
    shares = []
    for index in range(nodes):
        if quota_cpus is not None:
            width = min(len(cores), max(1, math.ceil(quota_cpus)))
            mine = tuple(cores[(index * width + k) % len(cores)] for k in range(width))
        elif nodes <= len(cores):
            start, end = index * len(cores) // nodes, (index + 1) * len(cores) // nodes
            mine = tuple(cores[start:end])
        else:
            mine = (cores[index % len(cores)],)
        group = _cgroup(f"{prefix}-node{index}", quota_cpus) if quota_cpus else None
        shares.append(CpuShare(mine, quota_cpus, group))
    return shares


def _cgroup(name: str, quota_cpus: float) -> Path | None:
    """A cgroup capped at quota_cpus; None (and a warning) when none can be made here."""
    quota_us = max(1000, int(quota_cpus * PERIOD_US))
    v1 = CGROUP_ROOT / "cpu"
    try:
        if (v1 / "cpu.cfs_quota_us").exists():
            group = v1 / name
            group.mkdir(exist_ok=True)
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota_us))
            return group
        if (CGROUP_ROOT / "cgroup.controllers").exists():
            group = CGROUP_ROOT / name
            group.mkdir(exist_ok=True)
            (group / "cpu.max").write_text(f"{quota_us} {PERIOD_US}")
            return group
    except OSError as exc:
        log.warning("no CPU quota for %s: cgroups are not writable here (%s)", name, exc)
        return None
    log.warning("no CPU quota for %s: no cgroup cpu controller found", name)
    return None
