"""`serval plan`'s table: each figure under its header."""

from __future__ import annotations

import pytest

from serval.planner.cost import plan
from tests.unit.planner.test_cost import CATALOG, RUNS

pytestmark = pytest.mark.unit


def test_the_table_puts_each_figure_under_its_header() -> None:
    from rich.console import Console

    from serval.cli.plan import _rows
    from serval.cli.tables import rich_table

    console = Console(width=200, record=True)
    console.print(rich_table(_rows(plan(RUNS, CATALOG, slo_p99_ms=38, target_rps=1000), 38,
                                   1000)))
    text = console.export_text().splitlines()
    header = [c.strip() for c in next(t for t in text if t.startswith("┃")).split("┃")[1:-1]]
    inf = [c.strip() for c in next(t for t in text if t.startswith("│")).split("│")[1:-1]]
    row = dict(zip(header, inf, strict=True))
    assert row["hardware"] == "inf1.2xlarge" and row["req/s at SLO"] == "307.0"
    assert row["$/hour"] == "0.435" and row["model"] == "recommender"
    assert row["p99 ms"] == "38.00" and row["replicas"] == "4" and row["$/month"] == "1,270.20"
    assert row["$ per 1M"] == "0.3936" and row["reduction"] == "80.5%"
