"""The report's figure: one p99 and one p50 curve per run, the CDFs, a valid PNG."""

from __future__ import annotations

import io
from typing import Any

import pytest

from serval.loadtest.report import figure, html_page, png_bytes

pytestmark = pytest.mark.unit


def _run(label: str, scale: float) -> dict[str, Any]:
    steps = []
    for concurrency in (1, 8, 64):
        p50 = scale * concurrency
        steps.append({"mode": "closed", "concurrency": concurrency, "offered_rps": None,
                      "requests": 100 * concurrency, "answered": 100 * concurrency,
                      "throughput_rps": 1000.0 * concurrency / (1 + concurrency / 16),
                      "p50_ms": p50, "p90_ms": 2 * p50, "p99_ms": 3 * p50, "p999_ms": 4 * p50,
                      "mean_ms": p50, "errors": {},
                      "cdf_ms": [[0.0, p50 / 2], [50.0, p50], [99.0, 3 * p50], [100.0, 5 * p50]]})
    steps.append({**steps[-1], "mode": "open", "concurrency": None, "offered_rps": 500.0})
    return {"label": label, "model": "mlp", "url": "http://127.0.0.1:1", "protocol": "http",
            "hardware": None, "duration_s": 1, "warmup_s": 0, "created": "now",
            "generator_ceiling_rps": 90000.0, "steps": steps}


def test_overlaid_runs_draw_two_curves_each_and_one_cdf_each() -> None:
    from PIL import Image

    runs = [_run("fp32", 1.0), _run("int8", 0.5), _run("other server", 2.0)]
    fig = figure(runs)
    curves, cdfs = fig.axes
    assert len(curves.get_lines()) == 9  # p99 + p50 (closed loop) + p99 (open loop) per run
    assert len(cdfs.get_lines()) == 3  # each run's highest-throughput step
    png = png_bytes(fig)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(io.BytesIO(png)) as image:
        image.verify()
    assert Image.open(io.BytesIO(png)).size == (1430, 572)


def test_one_run_draws_a_cdf_per_step_and_a_table() -> None:
    fig = figure([_run("only", 1.0)])
    assert len(fig.axes[0].get_lines()) == 3 and len(fig.axes[1].get_lines()) == 4
    closed_only = _run("closed", 1.0)
    closed_only["steps"] = closed_only["steps"][:3]
    assert len(figure([closed_only]).axes[0].get_lines()) == 2
    page = html_page([_run("only", 1.0)], png_bytes(fig))
    assert page.count("<tr>") == 5 and "500/s" in page and "c=64" in page
