"""`serval report RESULTS... -o report.html`: curves, CDFs and tables from load-test results."""

from __future__ import annotations

from pathlib import Path

import typer

from serval.cli.command import fail


def report_command(
    results: list[Path] = typer.Argument(..., help="Results files of `serval loadtest -o`."),
    output: Path = typer.Option(None, "--output", "-o",
                                help="report.html (a PNG is written beside it) or report.png "
                                "[default: report.html, never over an existing one]."),
) -> None:
    """Overlay several load-test results: latency vs throughput, latency CDFs, tables."""
    if output is None:
        output = Path("report.html")
        if output.exists() or output.with_suffix(".png").exists():
            fail("report.html or report.png exists here; name the report with -o "
                 "(an existing file given with -o is replaced)")
    from serval.loadtest.report import write_report
    from serval.loadtest.results import load_results

    try:
        runs = [load_results(path) for path in results]
    except ValueError as exc:
        fail(str(exc))
    if output.suffix.lower() == ".png":
        html_path, png_path = None, output
    else:
        html_path, png_path = output, output.with_suffix(".png")
    try:
        write_report(runs, html_path, png_path)
    except RuntimeError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {output}: {exc}")
    typer.echo("wrote " + " and ".join(str(p) for p in (html_path, png_path) if p))
