"""The benchmark tables in README and docs/ are the benchmarks' own output, rendered, never
hand-edited figures (bench/doc_tables.py)."""

from __future__ import annotations

import copy

import orjson
import pytest
from bench import doc_tables

pytestmark = pytest.mark.unit


def _all_regions() -> list[tuple[str, str, tuple[str, ...], str]]:
    return [(str(page.relative_to(doc_tables.ROOT)), name, files, body)
            for page in doc_tables.PAGES
            for name, files, body in doc_tables.regions(page.read_text())]


def test_every_generated_table_is_what_its_results_render() -> None:
    found = _all_regions()
    assert any(page == "README.md" and name == "engine-bound" for page, name, _, _ in found)
    stale = [(page, name) for page, name, _, body in found if doc_tables.render(name) != body]
    assert stale == [], "run `python bench/doc_tables.py` (or the benchmark that writes them)"


def test_every_committed_result_feeds_a_table_and_every_table_has_a_renderer() -> None:
    found = _all_regions()
    assert {p.stem for p in doc_tables.RESULTS.glob("*.json")} == {
        f for _, _, files, _ in found for f in files}
    for page, name, files, _ in found:
        assert doc_tables.RENDERERS[name][0] == files, f"{page}: {name} reads {files}?"


def test_a_changed_figure_changes_the_table() -> None:
    results = orjson.loads((doc_tables.RESULTS / "engine-bound.json").read_bytes())
    before = doc_tables.engine_bound(results)
    changed = copy.deepcopy(results)
    for run in changed["minilm"]["served"]["after"]["64"]:
        run["ratio"] = 0.5
    after = doc_tables.engine_bound(changed)
    assert after != before
    assert "| 0.50 |" in next(line for line in after.splitlines() if "`minilm`" in line)


def test_a_hand_edit_inside_a_region_is_put_back() -> None:
    page = (doc_tables.ROOT / "README.md").read_text()
    edited = page.replace("| `minilm` (engine-bound) |", "| `minilm` (engine-bound) | 9.99 |", 1)
    assert edited != page
    assert doc_tables.rewrite(edited) == page


def test_a_region_may_read_several_results_in_the_order_it_names_them() -> None:
    page = (doc_tables.ROOT / "docs" / "scale.md").read_text()
    [(name, files, _)] = [r for r in doc_tables.regions(page) if r[0] == "scale-measured"]
    assert files == ("serving", "ray-serve", "cluster") == doc_tables.RENDERERS[name][0]
    results = {f: orjson.loads((doc_tables.RESULTS / f"{f}.json").read_bytes()) for f in files}
    results["ray-serve"]["rows"]["standalone"]["64"]["throughput_rps"] = 1234.0
    table = doc_tables.scale_measured(*(results[f] for f in files))
    assert "binary REST: 1,234 req/s" in table
    ray = results["ray-serve"]["rows"]["ray-ingress"]["64"]["throughput_rps"]
    assert f"({ray / 1234:.0%} of S_lstm)" in table


def test_figures_a_run_did_not_print_are_left_blank_not_invented() -> None:
    results = orjson.loads((doc_tables.RESULTS / "gpu.json").read_bytes())
    results["served"]["1"]["fp32"]["one_item"] = {}
    results["raw"]["fp32"]["batches"]["1"]["p50_ms"] = None
    row = next(line for line in doc_tables.gpu(results).splitlines()
               if line.startswith("| fp32, 1 worker"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "" and cells[4].endswith(" ms") and "(" not in cells[4]


def test_a_region_under_a_list_item_keeps_its_indent() -> None:
    page = (doc_tables.ROOT / "docs" / "production.md").read_text()
    indented = [line for line in page.splitlines() if "`lstm` in-process / isolated" in line]
    assert indented and all(line.startswith("    | ") for line in indented)
    row = "| `lstm` in-process / isolated |"
    edited = page.replace("    " + row, row)
    assert edited != page and doc_tables.rewrite(edited) == page
