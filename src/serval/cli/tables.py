"""What a command prints as a table, in the format asked for: a rich table that never cuts a value
(it wraps text and grows past the terminal rather than shorten a number), JSON rows, or markdown."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text


class OutputFormat(StrEnum):
    """The values of every `--format` flag."""

    table = "table"
    json = "json"
    md = "md"


# The `--format` flag of every command whose output is a table.
FORMAT = typer.Option(OutputFormat.table, "--format",
                      help="table, json (a list of rows) or md (a markdown table).")


@dataclass(frozen=True)
class Column:
    """key: the JSON name; header: the table's; numbers are right-aligned."""

    key: str
    header: str
    numeric: bool = False


@dataclass(frozen=True)
class Cell:
    """A raw value for JSON and its text for people ('-' or a word where the value is None);
    style colours the table's cell only."""

    value: Any
    text: str
    style: str = ""


def cell(value: Any, shown: str | Callable[[Any], str] = "{}", missing: str = "-",
         style: str = "") -> Cell:
    """Cell(6386.1, '6,386.1') from cell(6386.1, '{:,.1f}'); None shows as MISSING."""
    if value is None:
        return Cell(None, missing, style)
    return Cell(value, shown(value) if callable(shown) else shown.format(value), style)


@dataclass
class Rows:
    """A table's columns and rows, with the title and caption the rich table shows."""

    columns: Sequence[Column]
    rows: list[list[Cell]] = field(default_factory=list)
    title: str | None = None
    caption: str | None = None

    def add(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))


def emit(rows: Rows, output: OutputFormat, console: Console) -> None:
    """Print ROWS: a table on CONSOLE, or JSON / markdown text on stdout."""
    if output is OutputFormat.json:
        typer.echo(orjson.dumps([{c.key: cell.value for c, cell in zip(rows.columns, row,
                                                                        strict=True)}
                                 for row in rows.rows],
                                option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
    elif output is OutputFormat.md:
        typer.echo(markdown(rows))
    else:
        console.print(rich_table(rows), crop=False)


def rich_table(rows: Rows) -> Table:
    """Every column at least as wide as its longest word (header included): cells wrap between
    words, never inside one, and the table grows past the terminal rather than cut a value."""
    table = Table(title=rows.title, caption=rows.caption)
    for index, column in enumerate(rows.columns):
        words = [word for row in rows.rows for word in row[index].text.split()]
        words += column.header.split()
        table.add_column(column.header, justify="right" if column.numeric else "left",
                         overflow="fold", min_width=max(map(len, words), default=1))
    for row in rows.rows:
        table.add_row(*(Text(c.text, style=c.style) for c in row))
    return table


def markdown(rows: Rows) -> str:
    """A GitHub-flavoured markdown table, the title above it and the caption below."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(" ".join(text.split()).replace("|", "\\|")
                                 for text in cells) + " |"

    lines = [f"**{rows.title}**", ""] if rows.title else []
    lines.append(line([c.header for c in rows.columns]))
    lines.append("|" + "|".join("---:" if c.numeric else "---" for c in rows.columns) + "|")
    lines += [line([c.text for c in row]) for row in rows.rows]
    if rows.caption:
        lines += ["", rows.caption]
    return "\n".join(lines)
