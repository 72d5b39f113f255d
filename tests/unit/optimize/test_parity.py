"""Parity figures and gates of `serval optimize` on arrays with known differences."""

from __future__ import annotations

import numpy as np
import pytest

from serval.optimize.parity import Thresholds, compare

pytestmark = pytest.mark.unit


def _probabilities(rows: int, classes: int, seed: int) -> np.ndarray:
    logits = np.random.default_rng(seed).standard_normal((rows, classes))
    exp = np.exp(logits)
    return (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)


def test_identical_outputs_pass_with_exact_figures() -> None:
    probs = _probabilities(50, 5, 0)
    result = compare({"p": probs}, {"p": probs.copy()}, Thresholds(max_abs=0.0))
    assert result.passed and result.failures == []
    (figures,) = result.outputs
    assert figures.items == 50 and figures.max_abs_error == 0.0
    assert figures.mean_cosine == pytest.approx(1.0) and figures.top1_agreement == 1.0
    assert figures.max_softmax_sum_error == pytest.approx(0.0, abs=1e-6)


def test_flipped_argmax_fails_top1_and_names_the_figure() -> None:
    probs = _probabilities(100, 4, 1)
    flipped = probs.copy()
    flipped[:10] = flipped[:10, ::-1]  # 10% of rows now rank the classes backwards
    result = compare({"p": probs}, {"p": flipped}, Thresholds(min_cosine=None))
    top1 = result.outputs[0].top1_agreement
    assert top1 is not None and top1 <= 0.9
    assert not result.passed
    assert any("top-1 agreement" in f and "--min-top1" in f for f in result.failures)


def test_nan_inf_and_broken_softmax_sums_are_failures() -> None:
    probs = _probabilities(20, 3, 2)
    broken = probs * 1.5
    broken[0, 0] = np.nan
    result = compare({"p": probs}, {"p": broken}, Thresholds())
    figures = result.outputs[0]
    assert figures.nan_or_inf == 1
    assert figures.max_softmax_sum_error is not None and figures.max_softmax_sum_error > 0.4
    assert any("NaN/Inf" in f for f in result.failures)
    assert any("sum to 1" in f for f in result.failures)


def test_embeddings_gate_on_cosine_not_top1() -> None:
    rng = np.random.default_rng(3)
    embeddings = rng.standard_normal((40, 16)).astype(np.float32)
    noisy = embeddings + 0.8 * rng.standard_normal(embeddings.shape).astype(np.float32)
    result = compare({"e": embeddings}, {"e": noisy}, Thresholds(min_cosine=0.99))
    figures = result.outputs[0]
    assert figures.max_softmax_sum_error is None  # not probabilities
    assert figures.mean_cosine is not None and figures.mean_cosine < 0.9
    assert [f for f in result.failures if "cosine" in f]
    assert not [f for f in result.failures if "top-1" in f]


def test_label_outputs_compare_by_agreement_and_shapes_must_match() -> None:
    labels = np.array([0, 1, 2, 1, 0, 2, 2, 1, 0, 0])
    other = labels.copy()
    other[0] = 2
    result = compare({"label": labels, "x": np.zeros((10, 2))},
                     {"label": other, "x": np.zeros((10, 3))}, Thresholds())
    assert result.outputs[0].top1_agreement == pytest.approx(0.9)
    assert any("label" in f and "top-1" in f for f in result.failures)
    assert any("shape (10, 3) != original (10, 2)" in f for f in result.failures)


def test_the_worst_row_gate_fails_one_bad_row_the_mean_forgives() -> None:
    rng = np.random.default_rng(4)
    embeddings = rng.standard_normal((300, 16)).astype(np.float32)
    moved = embeddings.copy()
    moved[7] = rng.standard_normal(16)  # one row far off; the other 299 exact
    forgiving = compare({"e": embeddings}, {"e": moved}, Thresholds(min_cosine=0.99))
    assert forgiving.passed and forgiving.outputs[0].min_cosine is not None
    strict = compare({"e": embeddings}, {"e": moved},
                     Thresholds(min_cosine=0.99, worst_cosine=0.97))
    assert strict.failures == [f"output 'e': worst row cosine "
                               f"{strict.outputs[0].min_cosine:.4f} < --worst-cosine 0.97"]
