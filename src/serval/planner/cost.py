"""The cost plan: per hardware, the best throughput meeting a p99 SLO and what it costs.

Seed 002's method, automated: at a fixed latency target compare throughput, then cost per
inference; the reduction rate is the share saved against the most expensive option.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from serval.planner.catalog import Catalog, Hardware

MAX_ERROR_SHARE = 0.001  # a step with more failed than this share of requests does not count


@dataclass(frozen=True)
class PlanRow:
    """One hardware option for one model, priced at the SLO (None where no step met it)."""

    model: str
    hardware: Hardware
    best_rps: float | None
    p99_ms: float | None
    usd_per_million: float | None
    replicas: int | None
    usd_per_month: float | None
    reduction: float | None  # share saved against the most expensive option


def best_at_slo(steps: Iterable[dict[str, Any]], slo_p99_ms: float) -> dict[str, Any] | None:
    """The highest-throughput step whose p99 meets the SLO and that (nearly) never failed."""
    good = [s for s in steps if s["requests"] > 0 and s["p99_ms"] <= slo_p99_ms
            and sum(s["errors"].values()) <= MAX_ERROR_SHARE * max(1, s["answered"])]
    return max(good, key=lambda s: s["throughput_rps"], default=None)


def usd_per_million(usd_per_hour: float, rps: float) -> float:
    return usd_per_hour / (rps * 3600.0) * 1e6


def plan(runs: list[dict[str, Any]], catalog: Catalog, slo_p99_ms: float,
         target_rps: float | None = None) -> list[PlanRow]:
    """One row per model and hardware measured (runs grouped by model and `hardware` tag).

    Per model, cheapest first; the reduction rate compares monthly costs at the target rate
    when one is given (replicas round up), else costs per million inferences.
    """
    steps_by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        name = run.get("hardware")
        if not name:
            raise ValueError(f"results '{run.get('label')}' carry no hardware tag "
                             "(run serval loadtest --hardware NAME)")
        if catalog.get(name) is None:
            raise ValueError(f"hardware {name!r} is not in the catalog")
        steps_by_key.setdefault((str(run.get("model", "")), name), []).extend(run["steps"])
    rows = []
    for model in dict.fromkeys(model for model, _ in steps_by_key):
        rows += _with_reductions(
            [_row(catalog, model, catalog.get(name), steps, slo_p99_ms, target_rps)  # type: ignore[arg-type]
             for (m, name), steps in steps_by_key.items() if m == model],
            target_rps is not None)
    return rows


def _row(catalog: Catalog, model: str, hardware: Hardware, steps: list[dict[str, Any]],
         slo_p99_ms: float, target_rps: float | None) -> PlanRow:
    best = best_at_slo(steps, slo_p99_ms)
    if best is None or best["throughput_rps"] <= 0:
        return PlanRow(model, hardware, None, None, None, None, None, None)
    rps = float(best["throughput_rps"])
    replicas = math.ceil(target_rps / rps) if target_rps else None
    monthly = (replicas * hardware.usd_per_hour * catalog.hours_per_month
               if replicas is not None else None)
    return PlanRow(model, hardware, rps, float(best["p99_ms"]),
                   usd_per_million(hardware.usd_per_hour, rps), replicas, monthly, None)


def _with_reductions(rows: list[PlanRow], by_month: bool) -> list[PlanRow]:
    def cost(row: PlanRow) -> float | None:
        return row.usd_per_month if by_month else row.usd_per_million

    priced = [c for row in rows if (c := cost(row)) is not None]
    top = max(priced, default=None)
    out = []
    for row in rows:
        c = cost(row)
        reduction = 1.0 - c / top if c is not None and top else None
        out.append(PlanRow(row.model, row.hardware, row.best_rps, row.p99_ms, row.usd_per_million,
                           row.replicas, row.usd_per_month, reduction))
    return sorted(out, key=lambda r: (cost(r) is None, cost(r) or 0.0))


def chart(rows: list[PlanRow], slo_p99_ms: float) -> Any:
    """Bars: cost per million inferences and throughput at the SLO, per hardware."""
    from serval.loadtest.report import _pyplot

    plt = _pyplot()
    priced = [r for r in rows if r.usd_per_million is not None]
    models = {r.model for r in priced}
    names = [r.hardware.name if len(models) == 1 else f"{r.model}\n{r.hardware.name}"
             for r in priced]
    fig, (cost_axes, rps_axes) = plt.subplots(1, 2, figsize=(12, 4.5))
    bars = cost_axes.bar(names, [r.usd_per_million for r in priced], color="tab:red")
    for bar, row in zip(bars, priced, strict=True):
        cost_axes.annotate(f"-{row.reduction:.0%}" if row.reduction else "",
                           (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                           ha="center", va="bottom", fontsize=8)
    cost_axes.set(title="USD per million inferences (lower is better)", ylabel="USD")
    rps_axes.bar(names, [r.best_rps for r in priced], color="tab:blue")
    rps_axes.set(title=f"throughput at p99 <= {slo_p99_ms:g} ms", ylabel="req/s")
    for axes in (cost_axes, rps_axes):
        axes.tick_params(axis="x", rotation=30)
        axes.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig
