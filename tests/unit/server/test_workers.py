"""`--workers`: auto picks more processes only where every model is HTTP-bound; N > 1 is refused
for an engine-bound model unless forced. Real ONNX Runtime models, really timed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from serval.backends.probe import (
    ENGINE_BOUND_MS,
    TIME_LIMIT_S,
    TIMED_CALLS,
    batch1_infer_ms,
    fastest_call_ms,
    zeros_batch1,
)
from serval.config import ServerConfig
from serval.errors import ConfigError
from serval.protocol.types import TensorSpec
from serval.server.workers import choose_workers, time_models
from tests import fixture_models

pytestmark = pytest.mark.unit


def engine_bound(repository: Path) -> Path:
    """64 layers of a 2048x2048 matrix (one 16 MB weight, shared): a batch-1 call reads it 64
    times: several ms even on a fast many-core machine."""
    return fixture_models.heavy(repository, "big", layers=64, width=2048, shared_weight=True)


def _config(repository: Path, workers: int | str, **extra: object) -> ServerConfig:
    return ServerConfig(repository=repository, workers=workers, http_port=8000, **extra)


def test_a_tiny_model_times_http_bound_and_a_big_one_engine_bound(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    engine_bound(tmp_path)
    timed = time_models(_config(tmp_path, 2), cores=2)
    assert set(timed) == {"linear", "big"}
    assert 0 < timed["linear"] < ENGINE_BOUND_MS <= timed["big"], timed


def test_auto_takes_a_worker_per_core_when_every_model_is_http_bound(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    fixture_models.add_sub(tmp_path)
    choice = choose_workers(_config(tmp_path, "auto"), cores=3)
    assert choice.count == 3
    assert "HTTP-bound" in choice.why


def test_auto_keeps_one_worker_for_an_engine_bound_model_and_names_it(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    engine_bound(tmp_path)
    choice = choose_workers(_config(tmp_path, "auto"), cores=2)
    assert choice.count == 1
    assert "engine-bound model big (" in choice.why


def test_more_workers_for_an_engine_bound_model_is_refused_with_the_way_out(
        tmp_path: Path) -> None:
    engine_bound(tmp_path)
    with pytest.raises(ConfigError) as refused:
        choose_workers(_config(tmp_path, 2), cores=2)
    message = str(refused.value)
    assert "--workers 2 would serve engine-bound model big" in message
    assert "--workers 1" in message and "--force-workers" in message
    assert str(tmp_path) not in message
    forced = choose_workers(_config(tmp_path, 2, force_workers=True), cores=2)
    assert forced.count == 2 and "--force-workers" in forced.why


def test_more_workers_for_http_bound_models_are_granted(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    assert choose_workers(_config(tmp_path, 4), cores=2).count == 4


@pytest.mark.parametrize("control", ["lazy", "explicit"])
def test_nothing_is_timed_when_nothing_loads_at_start(tmp_path: Path, control: str) -> None:
    engine_bound(tmp_path)
    auto = choose_workers(_config(tmp_path, "auto", model_control=control), cores=2)
    assert auto.count == 1 and f"--model-control {control}" in auto.why
    asked = choose_workers(_config(tmp_path, 2, model_control=control), cores=2)
    assert asked.count == 2 and "not checked" in asked.why


def test_one_worker_and_auto_on_a_port_chosen_per_process_load_nothing(tmp_path: Path) -> None:
    fixture_models.corrupt(tmp_path)  # would fail to load: so nothing loaded it
    assert choose_workers(_config(tmp_path, 1), cores=2).count == 1
    auto = ServerConfig(repository=tmp_path, workers="auto", http_port=0)
    assert choose_workers(auto, cores=2).count == 1


@pytest.mark.parametrize("workers", [0, 65, "many"])
def test_the_config_refuses_a_worker_count_out_of_range(tmp_path: Path,
                                                        workers: int | str) -> None:
    with pytest.raises(ValueError, match="workers"):
        _config(tmp_path, workers)


def test_zeros_take_every_free_dimension_as_one_and_strings_are_not_timed() -> None:
    feed = zeros_batch1([TensorSpec("a", "FP32", (-1, 3)), TensorSpec("b", "INT64", (2, -1))])
    assert feed is not None
    assert feed["a"].shape == (1, 3) and feed["b"].shape == (2, 1)
    assert str(feed["b"].dtype) == "int64" and not feed["a"].any()
    assert zeros_batch1([TensorSpec("t", "BYTES", (-1, 1))]) is None


def test_a_call_that_raises_is_not_timed() -> None:
    def refuse() -> None:
        raise RuntimeError("no")

    assert fastest_call_ms(refuse) == 0.0


def test_a_fast_call_is_timed_three_times_and_a_slow_one_once_after_the_first() -> None:
    calls: list[int] = []
    fastest_call_ms(lambda: calls.append(1))
    assert len(calls) == 1 + TIMED_CALLS
    slow: list[int] = []

    def over_the_limit() -> None:  # one call spends the whole time budget of the probe
        slow.append(1)
        time.sleep(TIME_LIMIT_S)

    assert fastest_call_ms(over_the_limit) >= TIME_LIMIT_S * 1e3
    assert len(slow) == 2  # the untimed first call, then one timed: start-up stays bounded


def test_a_model_without_infer_is_not_timed() -> None:
    assert batch1_infer_ms(object()) == 0.0  # type: ignore[arg-type]
