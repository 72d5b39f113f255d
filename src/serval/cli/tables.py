"""What a command prints as a table, in the format asked for: a rich table that fits the terminal
without cutting a value (cells and headers wrap at spaces, optional columns go, long text folds;
only a name or number wider than the terminal allows grows it), JSON rows, or markdown."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
import typer
from rich import box
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
    """key: the JSON name; header: the table's; numbers are right-aligned. optional: left out of
    a table too wide for the terminal (JSON and markdown keep it); fold: long text (a reason, an
    error) whose words may be folded across lines to fit; names and numbers never are."""

    key: str
    header: str
    numeric: bool = False
    optional: bool = False
    fold: bool = False


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
        console.print(rich_table(rows, console.width), crop=False)


FOLD_MIN_WIDTH = 12  # a fold column is never narrower than this
# (edges, per column) a bordered table takes beyond its text, and a compact one: no borders,
# columns one space apart
BORDERED, COMPACT = (1, 3), (-1, 1)


def rich_table(rows: Rows, width: int | None = None) -> Table:
    """A table that fits WIDTH where it can: every column at least as wide as its longest word
    (header included), so cells and headers wrap between words; while it is too wide, optional
    columns are left out (rightmost first), then the borders; a fold column may fold a longer
    word. Names and numbers are never cut: only they make a table wider than WIDTH. Line
    breaks inside a cell become spaces."""
    texts = [[" ".join(c.text.split()) for c in row] for row in rows.rows]
    columns = rows.columns
    least = [max([len(w) for row in texts for w in row[i].split()] + [1]
                 + [len(w) for w in c.header.split()]) for i, c in enumerate(columns)]
    base = [min(n, FOLD_MIN_WIDTH) if c.fold else n for n, c in zip(least, columns, strict=True)]
    shown = list(range(len(columns)))

    def room(indexes: list[int], frame: tuple[int, int] = BORDERED) -> int:
        """What WIDTH leaves after the frame and each column's least width."""
        return (width or 0) - frame[0] - sum(frame[1] + base[i] for i in indexes)

    if width is not None:
        for index in reversed(range(len(columns))):
            if room(shown) >= 0:
                break
            if columns[index].optional:
                shown.remove(index)
    frame = COMPACT if width is not None and room(shown) < 0 else BORDERED
    table = (Table(title=rows.title, caption=rows.caption) if frame is BORDERED else
             Table(title=rows.title, caption=rows.caption, box=box.SIMPLE_HEAD,
                   show_edge=False, padding=(0, 0)))
    # a name or number wider than WIDTH allows: each column at its least, the table grows
    fits = width is not None and room(shown, frame) >= 0
    widths = _widths(shown, texts, rows, base, room(shown, frame)) if fits else {}
    for i in shown:
        fixed = widths.get(i)
        table.add_column(columns[i].header, justify="right" if columns[i].numeric else "left",
                         overflow="fold", min_width=fixed or base[i], width=fixed)
    for row, text in zip(rows.rows, texts, strict=True):
        table.add_row(*(Text(text[i], style=row[i].style) for i in shown))
    return table


def _widths(shown: list[int], texts: list[list[str]], rows: Rows, base: list[int],
            spare: int) -> dict[int, int]:
    """Each shown column's width: its least, then what SPARE allows towards its longest line
    (header included), the columns nearest theirs first (so short headers stay on one line)."""
    widths = {i: base[i] for i in shown}
    natural = {i: max([len(row[i]) for row in texts] + [len(rows.columns[i].header)])
               for i in shown}
    for i in sorted(shown, key=lambda i: natural[i] - base[i]):
        grow = max(0, min(natural[i] - base[i], spare))
        widths[i] += grow
        spare -= grow
    return widths


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
