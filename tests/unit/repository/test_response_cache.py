"""The response cache: what a request's key depends on, the byte bound and LRU order, what is
forgotten when, and the lookup counted as Triton counts it."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from serval.protocol.types import InferRequest, TensorDict
from serval.repository import response_cache
from serval.repository.response_cache import (
    ENTRY_OVERHEAD_BYTES,
    OFF_LOOP_BYTES,
    ResponseCache,
    look_up,
    request_key,
)
from serval.stats import ModelStats

pytestmark = pytest.mark.unit

SCOPE = ("m", "1", 1)


def _request(**inputs: np.ndarray) -> InferRequest:
    return InferRequest(inputs=dict(inputs))


def _key(request: InferRequest, scope: tuple[str, str, int] = SCOPE) -> bytes:
    return request_key(scope, request)


def test_equal_requests_have_one_key_whatever_the_input_order() -> None:
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.int64)
    first = InferRequest(inputs={"A": a, "B": b})
    second = InferRequest(inputs={"B": b.copy(), "A": a.copy()})
    assert _key(first) == _key(second)
    assert len(_key(first)) == 16


@pytest.mark.parametrize("change", ["byte", "shape", "dtype", "name", "scope", "parameter",
                                    "parameter type", "bytes element"])
def test_anything_a_result_depends_on_changes_the_key(change: str) -> None:
    base = {"A": np.arange(6, dtype=np.float32).reshape(2, 3),
            "T": np.array([b"x", b"yz"], dtype=object)}
    request = InferRequest(inputs=dict(base), parameters={"k": 1})
    other = InferRequest(inputs=dict(base), parameters={"k": 1})
    scope = SCOPE
    if change == "byte":
        changed = base["A"].copy()
        changed[1, 2] = np.nextafter(changed[1, 2], np.float32(100))
        other.inputs["A"] = changed
    elif change == "shape":
        other.inputs["A"] = base["A"].reshape(3, 2)
    elif change == "dtype":
        other.inputs["A"] = base["A"].view(np.int32)
    elif change == "name":
        other.inputs = {"B": base["A"], "T": base["T"]}
    elif change == "scope":
        scope = ("m", "1", 2)  # the same version, loaded again
    elif change == "parameter":
        other.parameters = {"k": 2}
    elif change == "parameter type":
        other.parameters = {"k": True}
    else:
        other.inputs["T"] = np.array([b"xy", b"z"], dtype=object)  # same bytes, other split
    assert _key(request) != request_key(scope, other)


def test_transport_parameters_do_not_change_the_key() -> None:
    inputs = {"A": np.zeros(3, np.float32)}
    plain = InferRequest(inputs=inputs)
    steered = InferRequest(inputs=inputs, parameters={"timeout": 5000, "priority": 2,
                                                      "binary_data_output": True})
    assert _key(plain) == _key(steered)


def test_a_non_contiguous_input_keys_as_its_contiguous_copy() -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert _key(_request(A=array.T)) == _key(_request(A=np.ascontiguousarray(array.T)))


def _outputs(size: int, fill: float = 0.0) -> TensorDict:
    return {"Y": np.full(size // 4, fill, np.float32)}


def test_entries_are_read_only_copies_of_the_outputs() -> None:
    cache = ResponseCache(1 << 20)
    batch = np.arange(8, dtype=np.float32).reshape(4, 2)
    assert cache.put(SCOPE, b"k", {"Y": batch[1:2]})
    batch[1] = -1  # the engine's buffer is reused
    stored = cache.get(b"k")
    assert stored is not None
    np.testing.assert_array_equal(stored["Y"], [[2.0, 3.0]])
    assert stored["Y"].base is None and not stored["Y"].flags.writeable
    assert cache.bytes == ENTRY_OVERHEAD_BYTES + 8


def test_the_byte_bound_holds_and_the_least_recently_used_goes_first() -> None:
    entry = ENTRY_OVERHEAD_BYTES + 1024
    cache = ResponseCache(3 * entry)
    for key in (b"a", b"b", b"c"):
        assert cache.put(SCOPE, key, _outputs(1024))
    assert cache.get(b"a") is not None  # a is now the most recent
    assert cache.put(SCOPE, b"d", _outputs(1024))
    assert cache.get(b"b") is None and len(cache) == 3 and cache.evictions == 1
    assert all(cache.get(key) is not None for key in (b"a", b"c", b"d"))
    for index in range(100):  # a client sending only new requests
        cache.put(SCOPE, bytes([index]) * 16, _outputs(1024, index))
        assert cache.bytes <= cache.capacity
    assert cache.bytes == 3 * entry


def test_a_result_larger_than_the_cache_is_not_stored_and_evicts_nothing() -> None:
    cache = ResponseCache(ENTRY_OVERHEAD_BYTES + 4096)
    assert cache.put(SCOPE, b"small", _outputs(1024))
    assert not cache.put(SCOPE, b"big", _outputs(8192))
    assert cache.get(b"big") is None and cache.get(b"small") is not None


def test_a_key_stored_again_replaces_its_entry() -> None:
    cache = ResponseCache(1 << 20)
    cache.put(SCOPE, b"k", _outputs(64, 1.0))
    cache.put(SCOPE, b"k", _outputs(64, 2.0))
    stored = cache.get(b"k")
    assert stored is not None and stored["Y"][0] == 2.0
    assert len(cache) == 1 and cache.bytes == ENTRY_OVERHEAD_BYTES + 64


def test_bytes_outputs_count_their_elements() -> None:
    cache = ResponseCache(1 << 20)
    text = np.array([b"x" * 1000, "é" * 10], dtype=object)
    cache.put(SCOPE, b"k", {"T": text})
    assert cache.bytes >= ENTRY_OVERHEAD_BYTES + 1000 + 10


def test_forget_drops_one_loaded_version_and_composites_move_the_generation() -> None:
    cache = ResponseCache(1 << 20)
    cache.put(("m", "1", 1), b"m1", _outputs(64))
    cache.put(("m", "1", 2), b"m2", _outputs(64))
    cache.put(("p", "1", 3), b"p", _outputs(64), composite=True)
    cache.forget(("m", "1", 1))
    assert cache.get(b"m1") is None and cache.get(b"m2") is not None
    assert cache.generation == 0
    cache.forget_composites()
    assert cache.get(b"p") is None and cache.get(b"m2") is not None
    assert cache.generation == 1
    assert cache.bytes == ENTRY_OVERHEAD_BYTES + 64
    cache.forget(("never", "1", 9))  # nothing stored: nothing happens


def test_a_version_seen_calling_others_is_a_composite_until_released() -> None:
    cache = ResponseCache(1 << 20)
    caller = ("bls", "1", 4)
    assert not cache.is_composite(caller, pipeline=False)
    cache.put(caller, b"before", _outputs(64))  # stored by the request making the first call
    cache.calls_others(caller)
    cache.put(caller, b"after", _outputs(64))
    assert cache.is_composite(caller, pipeline=False)
    assert not cache.is_composite(("other", "1", 5), pipeline=False)
    cache.forget_composites()  # a model it may call changed
    assert cache.get(b"before") is None and cache.get(b"after") is None
    cache.release(caller)
    assert not cache.is_composite(caller, pipeline=False)


def _ask(cache: ResponseCache, stats: ModelStats, request: InferRequest, runs: list[int],
         scope: tuple[str, str, int] = SCOPE, composite: bool = False) -> TensorDict:
    """What the data plane does: look up; on a miss run the 'model' (x2) and store."""
    lookup = asyncio.run(look_up(cache, scope, composite, request, stats))
    if lookup.outputs is not None:
        return lookup.outputs
    runs.append(1)
    outputs = {"Y": request.inputs["A"] * 2}
    lookup.store(outputs)
    return outputs


def test_a_lookup_runs_the_model_once_per_key_and_counts_hits_and_misses() -> None:
    cache = ResponseCache(1 << 20)
    stats = ModelStats("m", "1")
    runs: list[int] = []
    answers = [_ask(cache, stats, _request(A=np.array(values, np.float32)), runs)
               for values in ([1, 2], [1, 2], [3, 4])]
    assert len(runs) == 2
    np.testing.assert_array_equal(answers[1]["Y"], [2, 4])
    np.testing.assert_array_equal(answers[2]["Y"], [6, 8])
    again = _ask(cache, stats, _request(A=np.array([1, 2], np.float32)), runs)
    assert again is not answers[1]  # each answer has its own dict
    assert (stats.cache_hit.count, stats.cache_miss.count) == (2, 2)
    assert stats.cache_hit.ns > 0 and stats.cache_miss.ns > 0
    entry = stats.as_triton_dict()["inference_stats"]
    assert entry["cache_hit"]["count"] == 2 and entry["cache_miss"]["count"] == 2  # type: ignore[index]


def test_a_pipeline_request_started_before_a_change_is_not_found_after_it() -> None:
    cache = ResponseCache(1 << 20)
    stats = ModelStats("p", "1")
    request = _request(A=np.ones(2, np.float32))
    runs: list[int] = []
    for _ in range(2):
        lookup = asyncio.run(look_up(cache, ("p", "1", 1), True, request, stats))
        assert lookup.outputs is None
        runs.append(1)
        cache.forget_composites()  # a step model reloads while this request runs
        lookup.store({"Y": np.zeros(2, np.float32)})
    assert len(runs) == 2 and stats.cache_hit.count == 0
    assert asyncio.run(look_up(cache, ("p", "1", 1), True, request, stats)).outputs is None


def test_large_inputs_are_hashed_off_the_event_loop_to_the_same_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A 64 MiB input takes ~40 ms to hash: on the loop, every other request would wait."""
    threads: list[bool] = []

    def recording_key(*args: object) -> bytes:
        threads.append(threading.current_thread() is threading.main_thread())
        return request_key(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(response_cache, "request_key", recording_key)
    cache, stats = ResponseCache(1 << 30), ModelStats("m", "1")
    small = _request(A=np.ones(16, np.float32))
    large = _request(A=np.ones(OFF_LOOP_BYTES // 4 + 1, np.float32))
    keys = [asyncio.run(look_up(cache, SCOPE, False, r, stats)).key for r in (small, large)]
    assert threads == [True, False]
    assert keys == [_key(small), _key(large)]
