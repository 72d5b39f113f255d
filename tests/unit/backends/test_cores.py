"""usable_cores: affinity capped by the tightest cgroup CPU quota on this process's path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serval.backends.cores import cgroup_quota, usable_cores

pytestmark = pytest.mark.unit


def _tree(root: Path, files: dict[str, str], membership: str) -> Path:
    for relative, text in files.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    proc = root / "proc-self-cgroup"
    proc.write_text(membership)
    return proc


def test_v2_quota_caps_the_affinity(tmp_path: Path) -> None:
    proc = _tree(tmp_path, {"kubepods/pod1/cpu.max": "150000 100000\n",
                            "kubepods/cpu.max": "max 100000\n"}, "0::/kubepods/pod1\n")
    assert cgroup_quota(tmp_path, proc) == pytest.approx(1.5)
    assert usable_cores(tmp_path, proc, affinity=64) == 2  # 1.5 cores: two threads can run


def test_the_tightest_level_wins_and_affinity_can_be_lower(tmp_path: Path) -> None:
    proc = _tree(tmp_path, {"a/cpu.max": "400000 100000", "a/b/cpu.max": "800000 100000"},
                 "0::/a/b\n")
    assert usable_cores(tmp_path, proc, affinity=16) == 4
    assert usable_cores(tmp_path, proc, affinity=3) == 3


def test_v1_quota(tmp_path: Path) -> None:
    proc = _tree(tmp_path, {"cpu,cpuacct/docker/x/cpu.cfs_quota_us": "50000",
                            "cpu,cpuacct/docker/x/cpu.cfs_period_us": "100000",
                            "cpu,cpuacct/cpu.cfs_quota_us": "-1",
                            "cpu,cpuacct/cpu.cfs_period_us": "100000"},
                 "4:memory:/docker/x\n3:cpu,cpuacct:/docker/x\n")
    assert cgroup_quota(tmp_path, proc) == pytest.approx(0.5)
    assert usable_cores(tmp_path, proc, affinity=8) == 1


@pytest.mark.parametrize("text", ["max 100000", "garbage", "0 100000", "100000 0"])
def test_no_or_unreadable_quota_leaves_the_affinity(tmp_path: Path, text: str) -> None:
    proc = _tree(tmp_path, {"cpu.max": text}, "0::/\n")
    assert cgroup_quota(tmp_path, proc) is None
    assert usable_cores(tmp_path, proc, affinity=6) == 6


def test_no_cgroup_file_at_all(tmp_path: Path) -> None:
    assert usable_cores(tmp_path, tmp_path / "missing", affinity=5) == 5
    assert 1 <= usable_cores() <= len(os.sched_getaffinity(0))
