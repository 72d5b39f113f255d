"""`serval models`: inspect a model repository without serving it."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from serval.cli.command import ServalCommand, ServalGroup
from serval.errors import ConfigError
from serval.repository.layout import scan_repository

app = typer.Typer(cls=ServalGroup, no_args_is_help=True,
                  help="Inspect the models of a repository.")


@app.command("list", cls=ServalCommand)
def list_models(
    repository: Path = typer.Option(..., "--repository", "-r", help="Model repository folder."),
) -> None:
    """List every model: versions, backend, batching, and whether its config is valid."""
    try:
        directories = scan_repository(repository)
    except ConfigError as exc:
        typer.echo(f"serval: {exc}", err=True)
        raise typer.Exit(2) from None
    table = Table("model", "versions", "backend", "max batch", "instances", "status")
    for directory in directories:
        versions = ", ".join(directory.versions) or "-"
        try:
            config = directory.config()
        except ConfigError as exc:
            table.add_row(directory.name, versions, "-", "-", "-", f"[red]invalid: {exc}[/red]")
            continue
        max_batch = "auto" if config.max_batch_size is None else str(config.max_batch_size)
        status = "ok" if directory.versions else "[yellow]no version folder[/yellow]"
        table.add_row(directory.name, versions, config.backend, max_batch,
                      str(config.instances), status)
    Console().print(table)
