"""The tuner's search: coarse sweep then hill-climbing, every point once, within the budget."""

from __future__ import annotations

import time

import pytest

from serval.planner.trial import TrialConfig, TrialResult, model_config
from serval.planner.tuner import Search, SearchSpace, tune, untried, verdict

pytestmark = pytest.mark.unit

SPACE = SearchSpace({
    "intra_op_threads": (None, 1, 2), "inter_op_threads": (None,),
    "max_batch_size": (128, 1, 8, 32, 64), "max_queue_delay_ms": (0.0, 1.0, 2.0, 4.0),
    "instances": (1, 2), "workers": (1, 2), "version": (None,),
})


def _objective(config: TrialConfig) -> TrialResult:
    """A peaked landscape: best at threads 2, batch 32, delay 2 ms, 2 workers."""
    score = 1000.0
    score -= 80 * abs([1, 8, 32, 64, 128].index(config.max_batch_size) - 2)
    score -= 60 * abs([0.0, 1.0, 2.0, 4.0].index(config.max_queue_delay_ms) - 2)
    score += 50 * (config.intra_op_threads == 2) + 120 * (config.workers == 2)
    return TrialResult(config, score, 10.0, 16)


def test_search_finds_the_peak_and_measures_each_point_once() -> None:
    seen: list[tuple[str, TrialConfig]] = []
    search = Search(_objective, budget_s=60, on_trial=lambda p, r: seen.append((p, r.config)))
    default, best = tune(SPACE, search)
    assert default.config == SPACE.default() and seen[0][0] == "default"
    assert (best.config.intra_op_threads, best.config.max_batch_size,
            best.config.max_queue_delay_ms, best.config.workers) == (2, 32, 2.0, 2)
    assert len({c for _, c in seen}) == len(seen)  # no point measured twice
    assert {p for p, _ in seen} >= {"default", "coarse", "combined"}
    full_grid = 3 * 5 * 4 * 2 * 2
    assert len(seen) < full_grid / 3
    assert "x" in verdict(default, best)


def test_a_default_that_fails_ends_the_search() -> None:
    """A model that fails as configured (it cannot load) fails under every other knob too."""
    def broken(config: TrialConfig) -> TrialResult:
        return TrialResult(config, 0.0, 0.0, 0, error="failed to load 'm'")

    search = Search(broken, budget_s=60)
    default, best = tune(SPACE, search)
    assert list(search.trials) == [SPACE.default()] and best is default


def test_a_default_that_misses_the_slo_still_searches() -> None:
    def only_two_workers(config: TrialConfig) -> TrialResult:
        return TrialResult(config, 100.0 * (config.workers == 2), 10.0, 16)

    search = Search(only_two_workers, budget_s=60)
    default, best = tune(SPACE, search)
    assert default.rps_at_slo == 0 and best.config.workers == 2


def test_the_budget_stops_the_search() -> None:
    def slow(config: TrialConfig) -> TrialResult:
        time.sleep(0.05)
        return _objective(config)

    search = Search(slow, budget_s=0.22)
    tune(SPACE, search)
    assert 2 <= len(search.trials) <= 5
    # the budget ended the coarse sweep: which knobs it never tried is known
    assert search.cut_in == "coarse"
    never = untried(SPACE, search)
    assert never and "workers" in never and "intra_op_threads" not in never


def test_a_search_that_ends_by_itself_was_not_cut_short() -> None:
    search = Search(_objective, budget_s=60)
    tune(SPACE, search)
    assert search.cut_in is None and untried(SPACE, search) == []


def test_verdict_says_when_the_default_is_good_enough() -> None:
    default = TrialResult(SPACE.default(), 100.0, 5.0, 4)
    near = TrialResult(TrialConfig(workers=2), 104.0, 5.0, 4)
    assert "within 5%" in verdict(default, near)
    assert "1.20x" in verdict(default, TrialResult(TrialConfig(workers=2), 120.0, 5.0, 4))
    assert "no configuration" in verdict(TrialResult(SPACE.default(), 0, 0, 0),
                                         TrialResult(SPACE.default(), 0, 0, 0))


def test_trial_config_becomes_a_model_config() -> None:
    from serval.model_config import ModelConfig

    trial = TrialConfig(intra_op_threads=1, max_batch_size=8, max_queue_delay_ms=2.0,
                        instances=2, version="1")
    config = model_config({"backend": "onnxruntime", "max_batch_size": 128}, trial)
    parsed = ModelConfig.model_validate(config)
    assert parsed.max_batch_size == 8 and parsed.instances == 2
    assert parsed.batching.max_queue_delay_ms == 2.0 and parsed.onnxruntime.intra_op_threads == 1
    assert parsed.version_policy.specific == [1]
