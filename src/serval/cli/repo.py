"""`serval repo`: publish versions as snapshots, list them, roll back, verify checksums."""

from __future__ import annotations

import functools
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import orjson
import typer
from rich.console import Console

from serval.cli.address import address, host_port
from serval.cli.command import ServalCommand, ServalGroup, fail
from serval.cli.tables import FORMAT, Cell, Column, OutputFormat, Rows, cell, emit
from serval.errors import ConfigError
from serval.repository import store

T = TypeVar("T")

app = typer.Typer(cls=ServalGroup, no_args_is_help=True,
                  help="Versioned snapshots of models: publish, history, rollback, verify.")
REPOSITORY = typer.Option(..., "--repository", "-r", help="Model repository folder.")
SERVER = typer.Option(None, "--server", parser=address, metavar="HOST:PORT",
                      help="host:port of a running Serval to reload now.")


@app.command("publish", cls=ServalCommand)
def publish_command(
    source: Path = typer.Argument(..., help="Model file or folder to publish."),
    repository: Path = REPOSITORY,
    model: str = typer.Option(..., "--model", "-m", help="Model name in the repository."),
    note: str = typer.Option("", help="Where this version came from (stored in the manifest)."),
    report: Path = typer.Option(None, help="A JSON parity report to store with the version."),
    server: str = SERVER,
    create: bool = typer.Option(False, "--create",
                                help="Create the repository folder if it does not exist."),
) -> None:
    """Write SOURCE as the model's next version: atomically, with a checksum manifest."""
    report_doc = _read_report(report) if report else None
    pinned = _run(lambda: store.pinned_version(repository, model))
    version = _run(lambda: store.publish(source, repository, model, note=note, report=report_doc,
                                         create=create))
    typer.echo(f"published {model} version {version}")
    if pinned is not None:
        typer.echo(f"warning: {model} is pinned to version {pinned} (repo rollback), so version "
                   f"{version} does not serve; `serval repo unpin {model}` serves the latest",
                   err=True)
    _reload(server, model)


@app.command("history", cls=ServalCommand)
def history_command(model: str = typer.Argument(...), repository: Path = REPOSITORY,
                    output: OutputFormat = FORMAT) -> None:
    """Every version of MODEL, oldest first; the serving one is marked (pinned: by a
    rollback, until `repo unpin`)."""
    records = _run(lambda: store.history(repository, model))
    rows = Rows([Column("version", "version"), Column("serving", "serving"),
                 Column("created", "created"), Column("source", "source"),
                 Column("files", "files", True)])
    for record in records:
        mark = ("* pinned" if record.pinned else "*") if record.serving else ""
        rows.add(cell(record.version), Cell(record.serving, mark),
                 cell(record.created_at), cell(record.source), cell(len(record.files)))
    emit(rows, output, Console())


@app.command("rollback", cls=ServalCommand)
def rollback_command(
    model: str = typer.Argument(...),
    repository: Path = REPOSITORY,
    to: str = typer.Option(None, "--to", help="Version to serve (default: the previous one)."),
    server: str = SERVER,
) -> None:
    """Serve an earlier version of MODEL; recorded in the repository, so it survives restarts."""
    version = _run(lambda: store.rollback(repository, model, to))
    typer.echo(f"{model} now serves version {version}")
    _reload(server, model)


@app.command("unpin", cls=ServalCommand)
def unpin_command(model: str = typer.Argument(...), repository: Path = REPOSITORY,
                  server: str = SERVER) -> None:
    """Release a rollback's pin: MODEL's latest version serves again."""
    pinned = _run(lambda: store.unpin(repository, model))
    latest = _run(lambda: store.latest_version(repository, model))
    if pinned is None:
        typer.echo(f"{model} was not pinned; version {latest} (the latest) serves")
    else:
        typer.echo(f"{model}: pin on version {pinned} released; version {latest} (the latest) "
                   "serves")
    _reload(server, model)


@app.command("snapshot", cls=ServalCommand)
def snapshot_command(repository: Path = REPOSITORY, name: str = typer.Option(
        None, "--name", help="The snapshot's name (default: the time, e.g. 20261126-141500).")
                     ) -> None:
    """Record which version of every model serves now; `repo restore NAME` brings it back."""
    from serval.repository import snapshots

    taken = _run(lambda: snapshots.take(repository, name))
    typer.echo(f"snapshot '{taken.name}': {len(taken.models)} model(s) "
               + ", ".join(f"{model} v{version}" for model, version in taken.models.items()))


@app.command("snapshots", cls=ServalCommand)
def snapshots_command(repository: Path = REPOSITORY, output: OutputFormat = FORMAT) -> None:
    """Every snapshot of the repository, oldest first."""
    from serval.repository import snapshots

    rows = Rows([Column("snapshot", "snapshot"), Column("created", "created"),
                 Column("models", "models")])
    for taken in _run(lambda: snapshots.listing(repository)):
        rows.add(cell(taken.name), cell(taken.created_at),
                 cell(", ".join(f"{m} v{v}" for m, v in taken.models.items())))
    emit(rows, output, Console())


@app.command("restore", cls=ServalCommand)
def restore_command(name: str = typer.Argument(..., help="A snapshot's name."),
                    repository: Path = REPOSITORY, server: str = SERVER) -> None:
    """Serve every model's version recorded in snapshot NAME again (each pinned, as by
    rollback; `repo unpin` releases one)."""
    from serval.repository import snapshots

    restored = _run(lambda: snapshots.restore(repository, name))
    typer.echo(f"restored snapshot '{restored.name}': "
               + ", ".join(f"{m} v{v}" for m, v in restored.models.items()))
    for model in restored.models:
        _reload(server, model)


@app.command("verify", cls=ServalCommand)
def verify_command(model: str = typer.Argument(None), repository: Path = REPOSITORY) -> None:
    """Check every version's files against its manifest; exits 1 if any is corrupted."""
    if not repository.is_dir():
        fail(f"{repository}: model repository directory not found")
    models = [model] if model else sorted(p.name for p in repository.iterdir() if p.is_dir()
                                          and not p.name.startswith((".", "_")))
    bad = 0
    for name in models:
        for record in _run(functools.partial(store.history, repository, name)):
            problems = store.verify_version(repository / name / record.version)
            status = ("corrupted: " + ", ".join(problems) if problems else "ok"
                      if record.manifest else "not checked: no manifest (not published with "
                      "`serval repo publish`)")
            bad += bool(problems)
            typer.echo(f"{name} version {record.version}: {status}")
    if bad:
        raise typer.Exit(1)


def _run(action: Callable[[], T]) -> T:
    """Run a store action; a ConfigError is the CLI's one-line failure (exit 2)."""
    try:
        return action()
    except ConfigError as exc:
        fail(str(exc))


def _read_report(path: Path) -> dict[str, object]:
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        fail(f"cannot read report {path}: {exc}")
    return doc if isinstance(doc, dict) else {"report": doc}


def _reload(server: str | None, model: str) -> None:
    if not server:
        return
    url = f"http://{host_port(server)}/v2/repository/models/{model}/load"
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=120)
    except urllib.error.HTTPError as exc:
        fail(f"the server refused the reload: {exc.read().decode()}", 1)
    except (OSError, ValueError) as exc:
        fail(f"cannot reach the server at {server}: {exc}", 1)
    typer.echo(f"{server} reloaded {model}")
