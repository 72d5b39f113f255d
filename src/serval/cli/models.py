"""`serval models`: inspect a model repository without serving it."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from serval.cli.command import ServalCommand, ServalGroup, fail
from serval.cli.tables import FORMAT, Cell, Column, OutputFormat, Rows, cell, emit
from serval.errors import ConfigError
from serval.repository.layout import scan_repository

app = typer.Typer(cls=ServalGroup, no_args_is_help=True,
                  help="Inspect the models of a repository.")


@app.command("list", cls=ServalCommand)
def list_models(
    repository: Path = typer.Option(..., "--repository", "-r", help="Model repository folder."),
    output: OutputFormat = FORMAT,
) -> None:
    """List every model: versions, backend, batching, and whether its config is valid."""
    try:
        directories = scan_repository(repository)
    except ConfigError as exc:
        fail(str(exc))
    rows = Rows([Column("model", "model"), Column("versions", "versions"),
                 Column("backend", "backend"), Column("max_batch_size", "max batch", True),
                 Column("instances", "instances", True), Column("status", "status", fold=True)])
    for directory in directories:
        versions = cell(directory.versions, ", ".join)
        try:
            config = directory.config()
        except ConfigError as exc:
            rows.add(cell(directory.name), versions, cell(None), cell(None), cell(None),
                     Cell(f"invalid: {exc}", f"invalid: {exc}", "red"))
            continue
        status = (cell("ok") if directory.versions
                  else Cell("no version folder", "no version folder", "yellow"))
        rows.add(cell(directory.name), versions, cell(config.backend),
                 cell(config.max_batch_size, missing="auto"), cell(config.instances), status)
    emit(rows, output, Console())
