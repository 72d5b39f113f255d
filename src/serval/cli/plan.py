"""`serval plan RESULTS... --slo-p99-ms X`: which hardware serves the model at the SLO for least."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from serval.cli.command import fail
from serval.cli.duration import milliseconds
from serval.cli.tables import FORMAT, Column, OutputFormat, Rows, cell, emit


def plan_command(
    results: list[Path] = typer.Argument(..., help="Results of `serval loadtest --hardware`."),
    slo_p99_ms: float = typer.Option(..., "--slo-p99-ms", parser=milliseconds,
                                      metavar="DURATION",
                                      help="Latency target: p99 (a bare number is ms)."),
    target_rps: float = typer.Option(None, "--target-rps", help="Rate to provision for."),
    catalog_path: Path = typer.Option(None, "--catalog", help="Hardware catalog YAML "
                                      "(default: the one shipped with Serval)."),
    chart_path: Path = typer.Option(None, "--chart", help="Write a PNG chart here."),
    output: OutputFormat = FORMAT,
) -> None:
    """Per hardware: throughput at the SLO, cost per million, replicas, monthly cost, savings."""
    from serval.loadtest.results import load_results
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
    console = Console(stderr=output is not OutputFormat.table)
    emit(_rows(rows, slo_p99_ms, target_rps), output, console)
    if chart_path is not None:
        _write_chart(rows, slo_p99_ms, chart_path)
        console.print(f"chart written to {chart_path}")


def _rows(rows: list, slo_p99_ms: float, target_rps: float | None) -> Rows:  # type: ignore[type-arg]
    # $/hour, vCPU and accelerator describe the hardware its name already says: a narrow
    # terminal's table goes without them (JSON and markdown keep them)
    columns = [Column("model", "model"), Column("hardware", "hardware"),
               Column("usd_per_hour", "$/hour", True, optional=True),
               Column("vcpu", "vCPU", True, optional=True),
               Column("accelerator", "accelerator", optional=True),
               Column("rps_at_slo", "req/s at SLO", True), Column("p99_ms", "p99 ms", True)]
    if target_rps:
        columns += [Column("replicas", "replicas", True),
                    Column("usd_per_month", "$/month", True)]
    columns += [Column("usd_per_million", "$ per 1M", True),
                Column("reduction", "reduction", True)]
    sources = {f"{r.hardware.price_source} ({r.hardware.price_date})" for r in rows}
    table = Rows(columns, title=f"cost at p99 <= {slo_p99_ms:g} ms"
                               + (f", {target_rps:,.0f} req/s" if target_rps else ""),
                 caption="prices: " + "; ".join(sorted(sources)))
    for row in rows:
        hw = row.hardware
        met = row.best_rps is not None
        cells = [cell(row.model), cell(hw.name), cell(hw.usd_per_hour, "{:g}"), cell(hw.vcpu),
                 cell(hw.accelerator), cell(row.best_rps, "{:,.1f}", missing="SLO not met"),
                 cell(row.p99_ms if met else None, "{:.2f}")]
        if target_rps:
            cells += [cell(row.replicas if met else None),
                      cell(row.usd_per_month if met else None, "{:,.2f}")]
        cells += [cell(row.usd_per_million if met else None, "{:.4f}"),
                  cell(row.reduction, "{:.1%}")]
        table.add(*cells)
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
