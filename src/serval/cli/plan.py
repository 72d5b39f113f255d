"""`serval plan RESULTS... --slo-p99-ms X`: which hardware serves the model at the SLO for least."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from serval.cli.duration import milliseconds
from serval.cli.loadtest import fail


def plan_command(
    results: list[Path] = typer.Argument(..., help="Results of `serval loadtest --hardware`."),
    slo_p99_ms: float = typer.Option(..., "--slo-p99-ms", parser=milliseconds,
                                      metavar="DURATION", help="Latency target: p99 in ms."),
    target_rps: float = typer.Option(None, "--target-rps", help="Rate to provision for."),
    catalog_path: Path = typer.Option(None, "--catalog", help="Hardware catalog YAML "
                                      "(default: the one shipped with Serval)."),
    chart_path: Path = typer.Option(None, "--chart", help="Write a PNG chart here."),
) -> None:
    """Per hardware: throughput at the SLO, cost per million, replicas, monthly cost, savings."""
    from serval.loadtest.runner import load_results
    from serval.planner.catalog import load_catalog
    from serval.planner.cost import plan

    if slo_p99_ms <= 0 or (target_rps is not None and target_rps <= 0):
        fail("--slo-p99-ms and --target-rps must be > 0")
    try:
        catalog = load_catalog(catalog_path)
        runs = [load_results(path) for path in results]
        rows = plan(runs, catalog, slo_p99_ms, target_rps)
    except ValueError as exc:
        fail(str(exc))
    console = Console()
    console.print(_table(rows, slo_p99_ms, target_rps))
    if chart_path is not None:
        _write_chart(rows, slo_p99_ms, chart_path)
        console.print(f"chart written to {chart_path}")


def _table(rows: list, slo_p99_ms: float, target_rps: float | None) -> Table:  # type: ignore[type-arg]
    table = Table(title=f"cost at p99 <= {slo_p99_ms:g} ms"
                        + (f", {target_rps:,.0f} req/s" if target_rps else ""))
    columns = ["model", "hardware", "$/hour", "vCPU", "accelerator", "req/s at SLO", "p99 ms",
               "$ per 1M", "reduction"]
    if target_rps:
        columns[7:7] = ["replicas", "$/month"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("model", "hardware", "accelerator")
                         else "right")
    for row in rows:
        hw = row.hardware
        met = row.best_rps is not None
        cells = [row.model, hw.name, f"{hw.usd_per_hour:g}", str(hw.vcpu), hw.accelerator or "-",
                 f"{row.best_rps:,.1f}" if met else "SLO not met",
                 f"{row.p99_ms:.2f}" if met else "-"]
        if target_rps:
            cells += [str(row.replicas) if met else "-",
                      f"{row.usd_per_month:,.2f}" if met else "-"]
        cells += [f"{row.usd_per_million:.4f}" if met else "-",
                  f"{row.reduction:.1%}" if row.reduction is not None else "-"]
        table.add_row(*cells)
    sources = {f"{r.hardware.price_source} ({r.hardware.price_date})" for r in rows}
    table.caption = "prices: " + "; ".join(sorted(sources))
    return table


def _write_chart(rows: list, slo_p99_ms: float, path: Path) -> None:  # type: ignore[type-arg]
    from serval.loadtest.report import _pyplot
    from serval.planner.cost import chart

    try:
        fig = chart(rows, slo_p99_ms)
        fig.savefig(path, dpi=110)
        _pyplot().close(fig)
    except RuntimeError as exc:
        fail(str(exc))
