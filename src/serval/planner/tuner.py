"""The configuration search behind `serval tune`: a coarse sweep, then hill-climbing.

The space is a list of candidate values per knob (threads, max_batch_size, queue delay,
instances, workers, precision variants). The coarse sweep measures the default, then each knob
at each of its values with the others at default (one factor at a time); hill-climbing then moves
from the best point to its best neighbour (one knob one step along its list) until none is
better or the time budget is spent. Each point is measured once (a cache of trials).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from serval.planner.trial import TrialConfig, TrialResult

KNOBS = ("intra_op_threads", "inter_op_threads", "max_batch_size", "max_queue_delay_ms",
         "instances", "workers", "version")
WITHIN_DEFAULT = 0.05  # "the default is already within 5% of the best"


@dataclass(frozen=True)
class SearchSpace:
    """Candidate values per knob; the first value of each list is the default's."""

    values: dict[str, tuple[Any, ...]]

    def default(self) -> TrialConfig:
        return TrialConfig(**{knob: vals[0] for knob, vals in self.values.items()})

    def neighbours(self, point: TrialConfig) -> list[TrialConfig]:
        """One knob one step along its list, either way."""
        out = []
        for knob, vals in self.values.items():
            index = vals.index(getattr(point, knob))
            for step in (-1, 1):
                if 0 <= index + step < len(vals):
                    out.append(replace(point, **{knob: vals[index + step]}))
        return out

    def one_at_a_time(self) -> list[TrialConfig]:
        """Each knob at each of its values, the others at default."""
        default = self.default()
        return [replace(default, **{knob: value})
                for knob, vals in self.values.items() for value in vals[1:]]


@dataclass
class Search:
    """The trials so far, the budget, and who is told about each trial."""

    measure: Callable[[TrialConfig], TrialResult]
    budget_s: float
    on_trial: Callable[[str, TrialResult], None] = lambda phase, result: None
    started: float = field(default_factory=time.monotonic)
    trials: dict[TrialConfig, TrialResult] = field(default_factory=dict)
    longest_s: float = 0.0
    cut_in: str | None = None  # the phase the budget ended, if it ended one early

    def out_of_time(self) -> bool:
        return time.monotonic() - self.started + self.longest_s > self.budget_s

    def trial(self, phase: str, config: TrialConfig) -> TrialResult | None:
        """Measure a point once (None when the budget cannot fit another trial)."""
        if config in self.trials:
            return self.trials[config]
        if self.trials and self.out_of_time():
            self.cut_in = self.cut_in or phase
            return None
        began = time.monotonic()
        result = self.measure(config)
        self.longest_s = max(self.longest_s, time.monotonic() - began)
        self.trials[config] = result
        self.on_trial(phase, result)
        return result

    def best(self) -> TrialResult:
        return max(self.trials.values(), key=lambda r: r.rps_at_slo)


def tune(space: SearchSpace, search: Search) -> tuple[TrialResult, TrialResult]:
    """Run the search; (default's result, best result)."""
    default = search.trial("default", space.default())
    assert default is not None
    if default.error:  # the model fails as configured (it cannot load): no knob will mend it
        return default, default
    for config in space.one_at_a_time():
        if search.trial("coarse", config) is None:
            return default, search.best()
    # the coarse sweep's best value of each knob, combined
    combined = space.default()
    for knob in space.values:
        tried = [r for c, r in search.trials.items()
                 if all(getattr(c, k) == getattr(space.default(), k) for k in KNOBS if k != knob)]
        best_value = max(tried, key=lambda r: r.rps_at_slo).config
        combined = replace(combined, **{knob: getattr(best_value, knob)})
    search.trial("combined", combined)
    _climb(space, search)
    return default, search.best()


def _climb(space: SearchSpace, search: Search) -> None:
    current = search.best()
    while True:
        results = []
        for config in space.neighbours(current.config):
            result = search.trial("climb", config)
            if result is None:
                return
            results.append(result)
        better = max(results, key=lambda r: r.rps_at_slo, default=None)
        if better is None or better.rps_at_slo <= current.rps_at_slo:
            return
        current = better


def untried(space: SearchSpace, search: Search) -> list[str]:
    """Knobs the search never moved from their default (the budget ended it first)."""
    default = space.default()
    moved = {knob for config in search.trials for knob in KNOBS
             if getattr(config, knob) != getattr(default, knob)}
    return [knob for knob, values in space.values.items()
            if len(values) > 1 and knob not in moved]


def verdict(default: TrialResult, best: TrialResult) -> str:
    """The gain over the default, or that the default is already within 5% of the best."""
    if best.rps_at_slo <= 0:
        return "no configuration met the SLO"
    if default.rps_at_slo <= 0:
        return (f"the default misses the SLO; the best ({best.config.describe()}) serves "
                f"{best.rps_at_slo:,.1f} req/s")
    gain = best.rps_at_slo / default.rps_at_slo
    if gain < 1 + WITHIN_DEFAULT:
        return (f"the default is already within 5% of the best found "
                f"({default.rps_at_slo:,.1f} vs {best.rps_at_slo:,.1f} req/s, {gain:.2f}x)")
    return (f"best: {best.rps_at_slo:,.1f} req/s vs default {default.rps_at_slo:,.1f} req/s "
            f"at the SLO: {gain:.2f}x")
