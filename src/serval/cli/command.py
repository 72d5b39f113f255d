"""The command classes every `serval` command uses: help pages that never cut an option name at
any terminal width or off a TTY; and every failure as one line on stderr, no traceback (usage
errors, `fail` from a command, an OSError that reaches the top)."""

from __future__ import annotations

import math
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from typer.core import TyperArgument, TyperCommand, TyperGroup

from serval.cli import INTERRUPTED

ARGUMENTS = "Arguments"
OPTIONS = "Options"
COMMANDS = "Commands"


class ServalCommand(TyperCommand):
    """A command whose help keeps every option name whole, and whose number flags take finite
    numbers only (inf and nan are refused as the flag is read)."""

    def invoke(self, ctx: Any) -> Any:
        params: list[Any] = self.get_params(ctx)
        for param in params:
            value = ctx.params.get(param.name)
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, float) and not math.isfinite(item):
                    raise typer.BadParameter(f"{item} is not a finite number", ctx=ctx,
                                             param=param)
        return super().invoke(ctx)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        print_help(self, ctx)


class ServalGroup(TyperGroup):
    """A group of commands: whole help pages; as the entry point, every usage error and stray
    OSError as one line."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        print_help(self, ctx)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        standalone = kwargs.pop("standalone_mode", True)
        kwargs["standalone_mode"] = False
        if not standalone:
            return super().main(*args, **kwargs)
        try:
            code = super().main(*args, **kwargs)
        except typer.Abort:
            typer.echo("serval: aborted", err=True)
            sys.exit(1)
        except KeyboardInterrupt:  # Ctrl-C outside the command: the shell's code for SIGINT
            typer.echo("serval: interrupted", err=True)
            sys.exit(INTERRUPTED)
        except OSError as exc:  # a file or socket the command needed: its reason, no traceback
            typer.echo(f"serval: {' '.join(str(exc).split())}", err=True)
            sys.exit(1)
        except Exception as exc:
            if not _is_usage_error(exc):
                raise
            usage_error(exc)
        if code == INTERRUPTED:  # typer's answer to Ctrl-C (KeyboardInterrupt): say so
            typer.echo("serval: interrupted", err=True)
        sys.exit(code if isinstance(code, int) else 0)


def fail(message: str, code: int = 2) -> NoReturn:
    """Exit CODE with 'serval: MESSAGE' on stderr, on one line whatever MESSAGE holds."""
    typer.echo(f"serval: {' '.join(message.split())}", err=True)
    raise typer.Exit(code)


def _is_usage_error(exc: Exception) -> bool:
    """Click's own errors (bad or missing parameters), whichever click typer carries."""
    return callable(getattr(exc, "format_message", None)) and isinstance(
        getattr(exc, "exit_code", None), int)


def usage_error(exc: Any) -> NoReturn:
    """'serval: Missing option '--model'. (see 'serval tune --help')' on stderr; exit 2."""
    message = " ".join(str(exc.format_message()).split())
    message = message.replace("Value error, ", "")  # pydantic's prefix, from typer's coercion
    ctx = getattr(exc, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    typer.echo(f"serval: {message}{hint}", err=True)
    sys.exit(exc.exit_code)


def print_help(command: TyperCommand | TyperGroup, ctx: Any) -> None:
    """Usage, description, then one panel per help group: names never cut, help wraps."""
    console = Console(highlight=False)
    console.print(Text(command.get_usage(ctx), style="bold"))
    if command.help:
        console.print()
        console.print(Text(_first_paragraphs(command.help)))
    console.print()
    panels: dict[str, list[tuple[str, str]]] = {}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
        default = ARGUMENTS if isinstance(param, TyperArgument) else OPTIONS
        panel = getattr(param, "rich_help_panel", None) or default
        panels.setdefault(panel, []).append((record[0].replace(" / ", "\n"), record[1]))
    if isinstance(command, TyperGroup):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None and not sub.hidden:
                panel = getattr(sub, "rich_help_panel", None) or COMMANDS
                panels.setdefault(panel, []).append((name, sub.get_short_help_str(limit=300)))
    for title in sorted(panels, key=lambda t: (t != ARGUMENTS, t != OPTIONS, t != COMMANDS)):
        console.print(_panel(title, panels[title]))


def _panel(title: str, rows: list[tuple[str, str]]) -> Panel:
    table = Table(show_header=False, box=None, padding=(0, 1), expand=True)
    table.add_column(style="bold cyan", no_wrap=True, overflow="fold")
    table.add_column(ratio=1, overflow="fold")
    for names, help_text in rows:
        table.add_row(Text(names), Text(help_text))
    return Panel(Group(table), title=title, title_align="left", border_style="dim")


def _first_paragraphs(text: str) -> str:
    """A docstring's paragraphs, each on one line (the console wraps them)."""
    paragraphs = [" ".join(p.split()) for p in text.strip().split("\n\n")]
    return "\n\n".join(p for p in paragraphs if p)
