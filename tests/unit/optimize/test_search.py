"""`--quantize int8-auto`: the recipes tried (smoothed at a few alphas and static QDQ when
calibration data is given; embeddings and down-projections kept FP32 step by step), each
verified for real, the fastest passing one chosen; none passing is reported."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
import pytest

from serval.optimize import report, run, search
from serval.optimize.parity import ParityResult, Thresholds
from serval.optimize.quantize import QuantizeOptions
from tests import fixture_models
from tests.optimize_models import tiny_bert

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bert(tmp_path_factory.mktemp("bert") / "bert.onnx")


def _weights(path: Path) -> dict[str, tuple[int, ...]]:
    return {w.name: tuple(w.dims) for w in onnx.load(str(path)).graph.initializer}


def test_the_recipes_keep_embeddings_then_more_and_more_down_projections(bert: Path) -> None:
    found = search.candidates(bert)
    nodes = {n.name: n for n in onnx.load(str(bert)).graph.node}
    weights = _weights(bert)
    assert [c.name for c in found] == [
        "every node INT8", "embeddings FP32", "embeddings and 1 of 2 down-projections FP32",
        "embeddings and 2 of 2 down-projections FP32"]
    assert found[0].kept == ()
    embeddings = found[1].kept
    assert embeddings and {nodes[n].op_type for n in embeddings} == {"Gather"}
    for shorter, longer in itertools.pairwise(found):
        assert set(shorter.kept) < set(longer.kept)
    down = [n for n in found[-1].kept if n not in embeddings]
    assert len(down) == 2
    for name in down:  # a MatMul from the wider width (128) to the narrower (64)
        assert nodes[name].op_type == "MatMul"
        assert weights[nodes[name].input[1]] == (128, 64)


def test_with_calibration_every_node_int8_is_also_tried_smoothed_and_static(bert: Path) -> None:
    found = search.candidates(bert, (0.5, 0.7), static=True)
    assert [c.name for c in found[:5]] == [
        "every node INT8", "every node INT8, smoothed (alpha 0.5)",
        "every node INT8, smoothed (alpha 0.7)", "every node INT8, static QDQ (calibrated)",
        "embeddings FP32"]
    assert [(c.kept, c.alpha, c.mode) for c in found[1:4]] == [
        ((), 0.5, "int8-dynamic"), ((), 0.7, "int8-dynamic"), ((), None, "int8-static")]
    assert all(c.alpha is None and c.mode == "int8-dynamic" for c in found[4:])


def test_smoothing_is_not_tried_where_it_reaches_no_node(tmp_path: Path) -> None:
    path = fixture_models.add_sub(tmp_path)  # Add and Sub only
    assert [c.name for c in search.candidates(path, (0.5, 0.7), static=True)] == [
        "every node INT8", "every node INT8, static QDQ (calibrated)"]


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"input_ids": np.random.default_rng(seed).integers(1, 500, (64, 16)),
            "attention_mask": np.ones((64, 16), dtype=np.int64)}


def _search(bert: Path, work: Path, thresholds: Thresholds, speeds: list[float],
            calibration: dict[str, np.ndarray] | None = None,
            base: QuantizeOptions | None = None) -> tuple[search.Trial, list[search.Trial]]:
    feeds = _feeds(0)
    reference = run.convert.convert(str(bert), work / "reference.onnx", [], []).reference
    timed: list[list[Path]] = []

    def time_all(paths: list[Path]) -> list[float]:  # the choice is the point: known figures
        timed.append(paths)
        return speeds[:len(paths)]

    def verify(path: Path) -> ParityResult:
        return run._verify(reference, path, feeds, thresholds)

    found = search.search(bert, work, base or QuantizeOptions(search.AUTO), verify, time_all,
                          calibration)
    assert len(timed) <= 1  # the passing recipes are timed together, once
    return found


def test_among_equally_fast_recipes_with_no_fp32_node_the_most_accurate_wins(
        bert: Path, tmp_path: Path) -> None:
    chosen, trials = _search(bert, tmp_path, Thresholds(min_cosine=0.9, min_top1=None),
                             [100.0] * 9, calibration=_feeds(1))
    assert [t.candidate.alpha for t in trials[:5]] == [None, *search.ALPHAS]
    assert all(t.result.smoothing.startswith(f"alpha {t.candidate.alpha:g} on the inputs of ")
               for t in trials[1:5])
    assert trials[5].result.format.startswith("QDQ") and trials[5].result.calibration_items == 64
    unkept = [t for t in trials if not t.candidate.kept and t.parity.passed]
    assert chosen in unkept  # one speed: no node kept FP32, then the worst row moved least
    assert chosen.as_dict()["worst_cosine"] == max(t.as_dict()["worst_cosine"] for t in unkept)


def test_the_users_alpha_is_the_only_one_tried(bert: Path, tmp_path: Path) -> None:
    _, trials = _search(bert, tmp_path, Thresholds(min_cosine=0.9, min_top1=None), [1.0] * 6,
                        calibration=_feeds(1), base=QuantizeOptions(search.AUTO, smooth=0.6))
    assert [t.candidate.alpha for t in trials if t.candidate.alpha] == [0.6]


def test_the_fastest_recipe_that_passes_is_chosen(bert: Path, tmp_path: Path) -> None:
    chosen, trials = _search(bert, tmp_path, Thresholds(min_cosine=0.9, min_top1=None),
                             [100.0, 300.0, 200.0, 50.0])
    assert [t.parity.passed for t in trials] == [True] * 4
    assert chosen is trials[1] and chosen.items_per_s == 300.0
    assert chosen.result.excluded_nodes == chosen.candidate.kept
    assert chosen.path.is_file()


def test_a_recipe_within_five_percent_of_the_fastest_with_fewer_fp32_nodes_wins(
        bert: Path, tmp_path: Path) -> None:
    chosen, trials = _search(bert, tmp_path, Thresholds(min_cosine=0.9, min_top1=None),
                             [100.0, 290.0, 300.0, 50.0])
    assert chosen is trials[1]  # 290 is one speed with 300 here, and keeps fewer nodes FP32


def test_when_no_recipe_passes_the_most_accurate_is_reported_failing(
        bert: Path, tmp_path: Path) -> None:
    chosen, trials = _search(bert, tmp_path, Thresholds(max_abs=0.0), [])  # INT8 never exact
    assert not any(t.parity.passed for t in trials)
    assert all(t.items_per_s is None for t in trials)  # nothing timed that cannot be used
    assert chosen is trials[-1]
    assert "max abs error" in chosen.parity.failures[0]


def test_the_run_reports_every_recipe_and_publishes_the_chosen_one(bert: Path,
                                                                   tmp_path: Path) -> None:
    request = run.Request(source=str(bert), out=tmp_path / "out",
                          quantize=QuantizeOptions(search.AUTO), parity_items=64, sequence=16,
                          thresholds=Thresholds(min_top1=None), measure_duration_s=0.2,
                          threads=1)
    outcome = run.run(request)
    step = outcome.report["steps"][-1]
    assert outcome.passed and step["mode"] == "int8-auto"
    assert len(step["search"]) == 4 and step["recipe"] in [t["recipe"] for t in step["search"]]
    assert all(t["items_per_s"] > 0 for t in step["search"] if t["passed"])
    page = report.markdown(outcome.report)
    assert "## INT8 recipes tried (fastest passing chosen)" in page
    assert f"| {step['recipe']} |" in page
    assert not list((tmp_path / "out").glob("int8-auto-*"))  # trials stay in the work folder
    assert step["calibration"] == "none: no smoothed or static recipes"


def test_calibration_data_adds_the_smoothed_recipes_to_the_report(bert: Path,
                                                                  tmp_path: Path) -> None:
    np.savez(tmp_path / "calibration.npz", **_feeds(3))
    request = run.Request(source=str(bert), out=tmp_path / "out",
                          quantize=QuantizeOptions(search.AUTO, smooth=0.7),
                          calibration=tmp_path / "calibration.npz", parity_items=64,
                          sequence=16, thresholds=Thresholds(min_top1=None), measure=False)
    step = run.run(request).report["steps"][-1]
    assert step["calibration"] == str(tmp_path / "calibration.npz")
    smoothed = [t for t in step["search"] if t["smooth_alpha"] is not None]
    assert [t["recipe"] for t in smoothed] == ["every node INT8, smoothed (alpha 0.7)"]
