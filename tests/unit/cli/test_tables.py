"""Table output: a rich table never cuts a value, markdown stays one row per line, JSON is raw."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from serval.cli.tables import Cell, Column, OutputFormat, Rows, cell, emit, markdown, rich_table

pytestmark = pytest.mark.unit


def _rows() -> Rows:
    rows = Rows([Column("name", "model name"), Column("rps", "req/s at SLO", True),
                 Column("note", "note")], title="t", caption="prices: somewhere")
    rows.add(cell("minilm-quantized-int8-per-channel"), cell(6386.125, "{:,.1f}"),
             cell("a | b\nsecond line"))
    rows.add(cell("mlp"), cell(None, missing="SLO not met"), Cell(["x"], "x", "red"))
    return rows


@pytest.mark.parametrize("width", [20, 40, 80])
def test_a_narrow_console_wraps_or_grows_but_never_cuts(width: int) -> None:
    console = Console(width=width, record=True, color_system=None)
    emit(_rows(), OutputFormat.table, console)
    text = console.export_text()
    assert "\u2026" not in text
    for whole in ("minilm-quantized-int8-per-channel", "6,386.1", "req/s", "SLO"):
        assert whole in text, (whole, text)


def test_markdown_is_one_line_per_row_with_aligned_numbers() -> None:
    lines = markdown(_rows()).splitlines()
    assert lines[:2] == ["**t**", ""] and lines[-1] == "prices: somewhere"
    assert lines[2] == "| model name | req/s at SLO | note |"
    assert lines[3] == "|---|---:|---|"
    assert lines[4] == "| minilm-quantized-int8-per-channel | 6,386.1 | a \\| b second line |"
    assert lines[5] == "| mlp | SLO not met | x |"


def test_json_carries_the_raw_values_under_their_keys(capsys: pytest.CaptureFixture[str]) -> None:
    emit(_rows(), OutputFormat.json, Console())
    rows = json.loads(capsys.readouterr().out)
    assert rows == [{"name": "minilm-quantized-int8-per-channel", "rps": 6386.125,
                     "note": "a | b\nsecond line"},
                    {"name": "mlp", "rps": None, "note": ["x"]}]


def test_a_row_needs_one_cell_per_column() -> None:
    with pytest.raises(ValueError, match="1 cells for 3 columns"):
        _rows().add(cell(1))
    assert rich_table(_rows()).row_count == 2


def _printed(rows: Rows, width: int) -> list[str]:
    console = Console(width=width, record=True, color_system=None)
    emit(rows, OutputFormat.table, console)
    return console.export_text().splitlines()


def test_a_wide_table_drops_optional_columns_and_wraps_headers_to_fit_80() -> None:
    headers = ["model", "hardware", "$/hour", "vCPU", "accelerator", "req/s at SLO", "p99 ms",
               "replicas", "$/month", "$ per 1M", "reduction"]
    optional = {"$/hour", "vCPU", "accelerator"}
    rows = Rows([Column(f"c{i}", h, i > 1, optional=h in optional)
                 for i, h in enumerate(headers)])
    values = ["distilbert-base", "c6a.large", "0.0765", "2", "-", "2,891.6", "1.29", "1",
              "1,255.84", "0.0073", "0.0%"]
    rows.add(*(Cell(v, v) for v in values))
    lines = _printed(rows, 80)
    assert max(map(len, lines)) <= 80, "\n".join(lines)
    text = "\n".join(lines)
    for value in values[5:] + values[:2]:
        assert value in text, (value, text)
    assert not any(header in text for header in optional), text  # left out at 80
    assert _printed(rows, 200)[1].count("\u2503") == len(headers) + 1  # all, where they fit


def test_a_fold_column_folds_a_long_path_to_fit_and_line_breaks_become_spaces() -> None:
    rows = Rows([Column("model", "model"), Column("versions", "versions"),
                 Column("status", "status", fold=True)])
    path = "/tmp/some/long/repository/path/bad_config/config.yaml"
    rows.add(cell("bad_config"), cell("1"),
             cell(f"invalid: {path}: not valid YAML: while parsing\n  in line 1\nexpected ','"))
    lines = _printed(rows, 40)
    assert max(map(len, lines)) <= 40, "\n".join(lines)
    status = "".join(line.split("\u2502")[3].strip() + " " for line in lines if "\u2502" in line)
    assert "bad_config" in "\n".join(lines)
    assert "in line 1 expected ','" in status, status
    assert path.replace("/", "") in status.replace(" ", "").replace("/", ""), status
