"""Model lifecycle under concurrent operator actions, on a real server: an unload, a load or a
request that arrives while a load of the same model is still under way."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests import fixture_models, triton_sequence_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import Reply, call, infer, metric, wait_until_running

pytestmark = pytest.mark.integration

Factory = Callable[..., RunningServer]
WIDTH = 1024  # fixture_models.slow's
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, WIDTH], "data": [0.01] * WIDTH}]}


def _slow_to_load(root: Path, name: str, warmups: int) -> None:
    """A model whose load runs `warmups` batches of 64 through fixture_models.slow: a load
    that stays under way long enough for another request to arrive during it."""
    fixture_models.slow(root, name)
    (root / name / "config.yaml").write_text(
        "max_batch_size: 128\nwarmup:\n  - name: zeros\n    batch_size: 64\n"
        f"    count: {warmups}\n    inputs: {{x: {{datatype: FP32, dims: [{WIDTH}], "
        "data: zero}}\n")


def _states(server: RunningServer) -> dict[str, tuple[str, str]]:
    index = call(server.url, "POST", "/v2/repository/index").json()
    return {f"{e['name']}/{e['version']}": (e["state"], e["reason"]) for e in index}


def _wait_for(what: str, condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never {what} in {timeout_s} s"
        time.sleep(0.01)


def _in_background(send: Callable[[], Reply]) -> tuple[threading.Thread, list[Reply]]:
    replies: list[Reply] = []
    thread = threading.Thread(target=lambda: replies.append(send()))
    thread.start()
    return thread, replies


def test_an_unload_during_a_load_leaves_the_model_unloaded(server_factory: Factory,
                                                           tmp_path: Path) -> None:
    """An unload that arrives while the model loads waits for the load, then unloads: the
    model does not come up READY after its unload answered 200 (it did, serving on)."""
    _slow_to_load(tmp_path, "slow_load", warmups=30)
    server = server_factory(tmp_path, "--model-control", "explicit")
    loading, load_replies = _in_background(
        lambda: call(server.url, "POST", "/v2/repository/models/slow_load/load"))
    _wait_for("LOADING", lambda: _states(server)["slow_load/1"][0] == "LOADING")
    unload = call(server.url, "POST", "/v2/repository/models/slow_load/unload")
    loading.join()
    assert unload.status == 200, unload.body
    assert load_replies[0].status == 200, load_replies[0].body  # it came first, and loaded
    assert _states(server)["slow_load/1"] == ("UNAVAILABLE", "unloaded")
    refused = infer(server.url, "slow_load", X)
    assert refused.status in (400, 503) and "unloaded" in refused.error, refused.body
    assert call(server.url, "GET", "/v2/models/slow_load/ready").status != 200
    # and a load after it loads the model again
    assert call(server.url, "POST", "/v2/repository/models/slow_load/load").status == 200
    assert infer(server.url, "slow_load", X).status == 200


def test_a_load_while_the_same_model_waits_for_a_load_slot_loads_it_once(
        server_factory: Factory, tmp_path: Path) -> None:
    """A lazy request's load waits for the one load slot; an explicit load of the same model
    meanwhile joins that load. (It started a second one: the model loaded twice, and the first
    engine, no longer in the table, was never released nor counted against the budget.)"""
    _slow_to_load(tmp_path, "slow_load", warmups=30)
    fixture_models.add_sub(tmp_path, "cold")
    server = server_factory(tmp_path, "--model-control", "lazy", "--max-concurrent-loads", "1")
    pair = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}
                       for n in ("INPUT0", "INPUT1")]}
    occupying, occupied = _in_background(lambda: infer(server.url, "slow_load", X))
    _wait_for("LOADING", lambda: _states(server)["slow_load/1"][0] == "LOADING")
    waiting, waited = _in_background(lambda: infer(server.url, "cold", pair))
    _wait_for("a second miss", lambda: metric(server.url, "serval_model_cache_misses_total") == 2)
    assert _states(server)["cold/1"][0] == "UNAVAILABLE"  # its load waits for the slot
    load = call(server.url, "POST", "/v2/repository/models/cold/load")
    occupying.join()
    waiting.join()
    assert load.status == 200, load.body
    assert occupied[0].status == 200, occupied[0].body
    assert waited[0].status == 200, waited[0].body
    assert orjson.loads(waited[0].body)["outputs"][0]["data"] == [2.0] * 16
    assert metric(server.url, "serval_model_loads_total") == 2  # slow_load and cold, once each
    assert metric(server.url, "serval_model_cache_misses_total") == 2


def test_clients_over_more_models_than_the_budget_holds(server_factory: Factory,
                                                       tmp_path: Path) -> None:
    """Clients spread over 6 models where the budget holds 2, with 4 loads at once: a request
    that waited for its model's load gets that model (another load evicted it before the
    request could use it: 503 'evicted'), and the models resident never exceed the budget
    (concurrent loads each counted the same free room: 4.5 models resident)."""
    names = [f"h{index}" for index in range(6)]
    for name in names:
        fixture_models.heavy(tmp_path, name)  # ~4 MB resident each
    budget = 8 << 20
    server = server_factory(tmp_path, "--model-control", "lazy", "--memory-budget",
                            str(budget), "--max-concurrent-loads", "4")
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 384],
                                     "data": [0.01] * 384}]})
    replies: list[Reply] = []
    resident: list[float] = []
    done = threading.Event()

    def client(seed: int) -> None:
        for step in range(40):
            replies.append(infer(server.url, names[(seed * 7 + step * (seed + 1)) % 6], body))

    def watch() -> None:
        while not done.is_set():
            resident.append(metric(server.url, "serval_resident_bytes"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    clients = [threading.Thread(target=client, args=(seed,)) for seed in range(12)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    done.set()
    watcher.join()
    failed = [reply for reply in replies if reply.status != 200]
    assert len(replies) - len(failed) >= len(names), "hardly anything was served"
    for reply in failed:  # the one refusal allowed: every resident model is busy now
        assert reply.status == 503 and "every loaded model is busy" in reply.error, reply.body
    assert max(resident) <= budget, f"{max(resident)} bytes resident; the budget is {budget}"


def test_a_poll_reload_that_found_no_room_is_tried_again(server_factory: Factory,
                                                         tmp_path: Path) -> None:
    """Control all, a budget for one model, the poll on: a version published while the
    serving one is busy finds no room (503 'retry shortly'); once it is idle, the poll's next
    look loads the new version. (It never tried again: version 1 served on and readiness
    said 503 until some other edit of the folder.)"""
    repository, staged = tmp_path / "repository", tmp_path / "staged"
    fixture_models.slow(repository, "slow")
    fixture_models.slow(staged, "slow")
    server = server_factory(repository, "--memory-budget", "6MB", "--poll-interval-s", "0.1")
    big = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [128, WIDTH],
                                    "data": [0.01] * (128 * WIDTH)}]})
    busy = [threading.Thread(target=infer, args=(server.url, "slow", big)) for _ in range(16)]
    for thread in busy:
        thread.start()
    wait_until_running(server.url, "slow")
    (staged / "slow" / "1").rename(repository / "slow" / "2")  # a version appears whole
    _wait_for("the reload refused for want of room",
              lambda: "budget is full" in _states(server).get("slow/2", ("", ""))[1])
    for thread in busy:
        thread.join()
    _wait_for("version 2 READY", lambda: _states(server)["slow/2"][0] == "READY")
    assert orjson.loads(infer(server.url, "slow", X).body)["model_version"] == "2"
    assert call(server.url, "GET", "/v2/health/ready").status == 200


def test_an_edit_right_after_start_is_seen_by_the_poll(server_factory: Factory,
                                                       tmp_path: Path) -> None:
    """A config edited as soon as the server answers, before the poll's first look has read
    the repository (here 3,000 other model folders make that look take a while), reloads the
    model. (The first look took the edited folder as the baseline: the model served its old
    config until the next edit.)"""
    fixture_models.linear(tmp_path, "clf", config="max_batch_size: 8\n")
    for index in range(3000):
        (tmp_path / f"other{index}" / "1").mkdir(parents=True)
        (tmp_path / f"other{index}" / "config.yaml").write_text("max_batch_size: 8\n")
    server = server_factory(tmp_path, "--model-control", "explicit", "--load-model", "clf",
                            "--poll-interval-s", "0.1")
    (tmp_path / "clf" / "config.yaml").write_text("max_batch_size: 2\n")
    _wait_for("the edited config served", lambda: call(
        server.url, "GET", "/v2/models/clf/config").json()["max_batch_size"] == 2, 30.0)


def test_a_live_sequence_keeps_its_model_from_eviction(server_factory: Factory,
                                                       tmp_path: Path) -> None:
    """A stateful model with a live sequence (between its steps) is not evicted for another
    model: that one waits (503 'retry shortly'), and the sequence goes on with its state.
    (The model was evicted and the sequence's next step got 400 'not live'.) Once the
    sequence ends, the other model loads."""
    triton_sequence_models.build_one(tmp_path, "simple_sequence")
    fixture_models.add_sub(tmp_path, "other")
    sizes = [(tmp_path / name / "1" / "model.onnx").stat().st_size
             for name in ("simple_sequence", "other")]
    server = server_factory(tmp_path, "--model-control", "lazy", "--memory-budget",
                            str(sum(sizes) - 1))  # either one, not both

    def step(value: int, **flags: bool) -> Reply:
        doc = {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1],
                           "data": [value]}], "parameters": {"sequence_id": 7, **flags}}
        return infer(server.url, "simple_sequence", doc)

    first = step(1, sequence_start=True)
    assert first.status == 200, first.body
    pair = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}
                       for n in ("INPUT0", "INPUT1")]}
    refused = infer(server.url, "other", pair)
    assert refused.status == 503 and "every loaded model is busy" in refused.error, refused.body
    assert _states(server)["simple_sequence/1"][0] == "READY"
    going_on = step(2)
    assert going_on.status == 200, going_on.body
    assert step(3, sequence_end=True).status == 200
    assert infer(server.url, "other", pair).status == 200  # the ended sequence holds nothing
    assert _states(server)["simple_sequence/1"][0] == "EVICTED"


def test_a_half_written_serving_json_does_not_unpin_the_rollback(server_factory: Factory,
                                                                 tmp_path: Path) -> None:
    """serving.json pins version 1 (a rollback from 2); an operator rewriting it by hand is
    caught by the poll with the file empty: the load fails, naming it, and version 1 serves
    on. (The latest version, the one rolled back from, took over until the file was whole.)"""
    model = fixture_models.linear(tmp_path, "clf", seed=1)
    shutil.copytree(model.parent, tmp_path / "clf" / "2")
    pin = tmp_path / "clf" / "serving.json"
    pin.write_text('{"version": "1"}')
    server = server_factory(tmp_path, "--poll-interval-s", "0.1", "--repository-api")
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}
    assert infer(server.url, "clf", doc).json()["model_version"] == "1"
    pin.write_text("")  # as `echo ... > serving.json` leaves it for a moment
    _wait_for("the poll's reload refused", lambda: "serving.json" in server.log())
    assert infer(server.url, "clf", doc).json()["model_version"] == "1"
    refused = call(server.url, "POST", "/v2/repository/models/clf/load")
    assert refused.status == 400 and "serving.json" in refused.error, refused.body
    assert _states(server)["clf/1"][0] == "READY"
    assert _states(server).get("clf/2", ("not tracked",))[0] != "READY"
