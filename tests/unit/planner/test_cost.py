"""The cost plan's arithmetic on seed 002's published figures."""

from __future__ import annotations

from typing import Any

import pytest

from serval.planner.catalog import Catalog, Hardware
from serval.planner.cost import best_at_slo, plan, usd_per_million

pytestmark = pytest.mark.unit


def _step(rps: float, p99_ms: float, errors: int = 0) -> dict[str, Any]:
    return {"mode": "closed", "concurrency": 1, "requests": 100, "answered": 100,
            "throughput_rps": rps, "p99_ms": p99_ms, "errors": {"http_500": errors} if errors
            else {}}


def _hw(name: str, usd_per_hour: float) -> Hardware:
    return Hardware(name=name, usd_per_hour=usd_per_hour, vcpu=4, memory_gib=16,
                    price_source="seed 002", price_date="2022")


# Hyperconnect's light recommender: one T4 pod of g4dn.12xlarge ($1.2725/h) vs inf1.2xlarge.
CATALOG = Catalog(hardware=[_hw("gpu-pod", 1.2725), _hw("inf1.2xlarge", 0.435)])
RUNS = [{"label": "gpu", "hardware": "gpu-pod", "model": "recommender",
         "steps": [_step(102, 29), _step(155, 38), _step(210, 55)]},
        {"label": "inf", "hardware": "inf1.2xlarge", "model": "recommender",
         "steps": [_step(191, 31), _step(307, 38), _step(400, 47, errors=3)]}]


def test_reduction_rate_reproduces_seed_002() -> None:
    # at p99 <= 38 ms: 155 TPS on the GPU pod, 307 on Inferentia; the write-up says 82.7% cheaper
    rows = plan(RUNS, CATALOG, slo_p99_ms=38)
    inf, gpu = rows  # cheapest first
    assert (inf.hardware.name, gpu.hardware.name) == ("inf1.2xlarge", "gpu-pod")
    assert gpu.best_rps == 155 and inf.best_rps == 307
    assert gpu.usd_per_million == pytest.approx(1.2725 / (155 * 3600) * 1e6)  # 2.2805
    assert inf.usd_per_million == pytest.approx(0.39359, abs=1e-5)
    assert inf.reduction == pytest.approx(0.827, abs=0.0005) and gpu.reduction == 0.0
    # at ~30 ms (102 vs 191 TPS) the write-up says 81.7%
    inf, _ = plan(RUNS, CATALOG, slo_p99_ms=31)
    assert inf.reduction == pytest.approx(0.817, abs=0.0005)


def test_replicas_and_monthly_cost_for_a_target_rate() -> None:
    inf, gpu = plan(RUNS, CATALOG, slo_p99_ms=38, target_rps=1000)
    assert gpu.replicas == 7 and inf.replicas == 4  # ceil(1000/155), ceil(1000/307)
    assert gpu.usd_per_month == pytest.approx(7 * 1.2725 * 730)  # 6502.48
    assert inf.usd_per_month == pytest.approx(4 * 0.435 * 730)  # 1270.20
    assert inf.reduction == pytest.approx(1 - 1270.2 / 6502.475)


def test_steps_over_the_slo_or_failing_do_not_count() -> None:
    assert best_at_slo(RUNS[1]["steps"], 60)["throughput_rps"] == 307  # 400 had errors
    assert best_at_slo(RUNS[0]["steps"], 20) is None
    rows = plan(RUNS, CATALOG, slo_p99_ms=30)
    unmet = next(r for r in rows if r.hardware.name == "inf1.2xlarge")
    assert unmet.best_rps is None and unmet.reduction is None
    assert usd_per_million(3.6, 1.0) == pytest.approx(1000.0)


def test_each_model_is_planned_on_its_own() -> None:
    other = [{**run, "model": "vit", "steps": [_step(18, 670)]} for run in RUNS]
    rows = plan(RUNS + other, CATALOG, slo_p99_ms=700)
    assert [r.model for r in rows] == ["recommender", "recommender", "vit", "vit"]
    vit = [r for r in rows if r.model == "vit"]
    assert vit[0].best_rps == vit[1].best_rps == 18  # same rate: reduction = price ratio
    assert vit[0].reduction == pytest.approx(1 - 0.435 / 1.2725)


def test_untagged_or_unknown_hardware_is_refused() -> None:
    with pytest.raises(ValueError, match="no hardware tag"):
        plan([{**RUNS[0], "hardware": None}], CATALOG, 38)
    with pytest.raises(ValueError, match="not in the catalog"):
        plan([{**RUNS[0], "hardware": "p5.48xlarge"}], CATALOG, 38)
