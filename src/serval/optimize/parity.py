"""Step 4: the optimized model's outputs against the original's on the same inputs: max abs and
relative error, per-row cosine, top-1 agreement, softmax row sums, NaN/Inf, against thresholds."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

PROBABILITY_TOLERANCE = 1e-3  # reference rows summing to 1 within this are probabilities


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Parity gates; None switches a gate off."""

    min_cosine: float | None = 0.99
    min_top1: float | None = 0.99
    max_abs: float | None = None
    max_softmax_sum_error: float | None = 1e-2
    worst_cosine: float | None = None  # the lowest row's cosine (off unless asked for)


@dataclass(frozen=True, slots=True)
class OutputParity:
    """Measured agreement of one output tensor."""

    name: str
    items: int
    max_abs_error: float
    max_relative_error: float
    mean_cosine: float | None
    min_cosine: float | None
    top1_agreement: float | None
    max_softmax_sum_error: float | None
    nan_or_inf: int


@dataclass(frozen=True, slots=True)
class ParityResult:
    """Every output's figures, and the failures (empty when parity holds)."""

    outputs: list[OutputParity]
    thresholds: Thresholds
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "failures": self.failures,
                "thresholds": asdict(self.thresholds),
                "outputs": [asdict(o) for o in self.outputs]}


def compare(reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray],
            thresholds: Thresholds) -> ParityResult:
    """Compare every reference output with the candidate's output of the same name."""
    outputs, failures = [], []
    for name, want in reference.items():
        if name not in candidate:
            failures.append(f"output '{name}' is missing from the optimized model")
            continue
        got = np.asarray(candidate[name])
        if got.shape != np.shape(want):
            failures.append(f"output '{name}': shape {got.shape} != original {np.shape(want)}")
            continue
        figures = measure_output(name, np.asarray(want), got)
        outputs.append(figures)
        failures += check(figures, thresholds)
    return ParityResult(outputs, thresholds, failures)


def measure_output(name: str, want: np.ndarray, got: np.ndarray) -> OutputParity:
    """All figures for one output (integer outputs, e.g. labels, get agreement only)."""
    items = len(want) if want.ndim else 1
    bad = int(np.count_nonzero(~np.isfinite(got))) if got.dtype.kind == "f" else 0
    if want.dtype.kind not in "fc":
        agree = float(np.mean(want.reshape(items, -1) == got.reshape(items, -1)))
        return OutputParity(name, items, 0.0 if agree == 1 else float("nan"), 0.0, None, None,
                            agree, None, bad)
    a = want.reshape(items, -1).astype(np.float64)
    b = np.nan_to_num(got.reshape(items, -1).astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    diff = np.abs(a - b)
    relative = diff / np.maximum(np.abs(a), 1e-6)
    cosine = _row_cosine(a, b)
    top1 = float(np.mean(a.argmax(axis=1) == b.argmax(axis=1))) if a.shape[1] > 1 else None
    sums = None
    if a.shape[1] > 1 and bool(np.all(a >= 0)) and bool(
            np.all(np.abs(a.sum(axis=1) - 1) < PROBABILITY_TOLERANCE)):
        sums = float(np.abs(b.sum(axis=1) - 1).max())
    return OutputParity(name, items, float(diff.max(initial=0.0)),
                        float(relative.max(initial=0.0)), float(cosine.mean()),
                        float(cosine.min()), top1, sums, bad)


def _row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    both_zero = (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(b, axis=1) == 0)
    cosine = (a * b).sum(axis=1) / np.maximum(norms, 1e-12)
    return np.where(both_zero, 1.0, cosine)


def check(o: OutputParity, t: Thresholds) -> list[str]:
    """The gates one output fails, each as a sentence with the figure and the threshold."""
    failures = []
    if o.nan_or_inf:
        failures.append(f"output '{o.name}': {o.nan_or_inf} NaN/Inf values")
    if t.min_cosine is not None and o.mean_cosine is not None and o.mean_cosine < t.min_cosine:
        failures.append(f"output '{o.name}': mean cosine {o.mean_cosine:.4f} < "
                        f"--min-cosine {t.min_cosine}")
    if t.worst_cosine is not None and o.min_cosine is not None and o.min_cosine < t.worst_cosine:
        failures.append(f"output '{o.name}': worst row cosine {o.min_cosine:.4f} < "
                        f"--worst-cosine {t.worst_cosine}")
    gate_top1 = o.max_softmax_sum_error is not None or o.mean_cosine is None
    if (t.min_top1 is not None and gate_top1 and o.top1_agreement is not None
            and o.top1_agreement < t.min_top1):
        failures.append(f"output '{o.name}': top-1 agreement {o.top1_agreement:.2%} < "
                        f"--min-top1 {t.min_top1:.2%}")
    if t.max_abs is not None and not o.max_abs_error <= t.max_abs:
        failures.append(f"output '{o.name}': max abs error {o.max_abs_error:.3g} > "
                        f"--max-abs {t.max_abs}")
    if (t.max_softmax_sum_error is not None and o.max_softmax_sum_error is not None
            and o.max_softmax_sum_error > t.max_softmax_sum_error):
        failures.append(f"output '{o.name}': probability rows sum to 1 ± "
                        f"{o.max_softmax_sum_error:.3g} > {t.max_softmax_sum_error}")
    return failures
