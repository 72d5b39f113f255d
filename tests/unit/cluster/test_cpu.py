"""How local nodes share the machine's cores."""

from __future__ import annotations

import pytest

from serval.cluster import cpu

pytestmark = pytest.mark.unit


@pytest.fixture
def eight_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "machine_cores", lambda: list(range(8)))


@pytest.mark.usefixtures("eight_cores")
def test_enough_cores_are_split_into_contiguous_groups() -> None:
    shares = cpu.plan_shares(3, None, "t")
    assert [s.cores for s in shares] == [(0, 1), (2, 3, 4), (5, 6, 7)]
    assert all(s.cgroup is None and s.quota_cpus is None for s in shares)


@pytest.mark.usefixtures("eight_cores")
def test_more_nodes_than_cores_take_turns() -> None:
    assert [s.cores for s in cpu.plan_shares(10, None, "t")][7:] == [(7,), (0,), (1,)]


@pytest.mark.usefixtures("eight_cores")
def test_a_quota_gives_each_node_ceil_quota_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "_cgroup", lambda name, quota: None)
    shares = cpu.plan_shares(3, 1.5, "t")
    assert [s.cores for s in shares] == [(0, 1), (2, 3), (4, 5)]
    assert all(s.quota_cpus == 1.5 for s in shares)


def test_a_quota_must_be_positive() -> None:
    with pytest.raises(ValueError, match="> 0"):
        cpu.plan_shares(2, 0.0, "t")
