"""`serval token create`: a new bearer token, printed once; only its hash is kept."""

from __future__ import annotations

from pathlib import Path

import typer

from serval.auth import create_token
from serval.cli.command import ServalCommand, ServalGroup, fail
from serval.errors import ConfigError

app = typer.Typer(cls=ServalGroup, no_args_is_help=True,
                  help="Bearer tokens for --auth-tokens.")


@app.command("create", cls=ServalCommand)
def create_command(
    tokens_file: Path = typer.Option(..., "--tokens-file", help="The tokens YAML (created)."),
    scope: list[str] = typer.Option(..., "--scope",
                                    help="read, admin, or infer:<model-glob>; repeatable."),
    name: str = typer.Option("token", help="A name for the logs and error messages."),
) -> None:
    """Print a new token (store it now: it is not shown again) and record its hash."""
    try:
        secret = create_token(tokens_file, scope, name)
    except ConfigError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write {tokens_file}: {exc.strerror or exc}")
    typer.echo(secret)
