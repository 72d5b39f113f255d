"""Triton's response cache (`--cache-config local,size=N`; a model opts in with config.pbtxt's
`response_cache { enable: true }` or config.yaml's `response_cache: true`).

A request's key hashes what its result depends on: the model version as loaded (name, version,
and which load of it), every input's name, datatype, shape and bytes, and its request
parameters but those that only steer transport (timeout, priority, binary output). A hit
answers with the outputs stored by the first request of that key, without running the model;
a miss runs it and stores the outputs (a compact, read-only copy). Entries are evicted least
recently used first, the sum of their bytes bounded by the cache's size; a result larger than
the whole cache is not stored. A version's entries go when it is released (unloaded, replaced,
evicted); a pipeline's also go whenever any model loads or is released, since its steps may
have changed. Everything runs on the event loop: no locks.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from serval.protocol.bytes_tensor import encode_bytes_elements
from serval.protocol.types import InferRequest, TensorDict
from serval.stats import ModelStats

# Request parameters that change how an answer travels, never what it holds.
TRANSPORT_PARAMETERS = frozenset({"timeout", "priority", "binary_data_output",
                                  "triton_enable_empty_final_response"})
ENTRY_OVERHEAD_BYTES = 512  # the key, the index entries and the arrays' headers, roughly
Scope = tuple[str, str, int]  # model name, version, load number


class ResponseCache:
    """Whole results by request key, least recently used evicted first, at most `capacity`
    bytes in all (0: no cache)."""

    def __init__(self, capacity_bytes: int = 0) -> None:
        self.capacity = capacity_bytes
        self.bytes = 0
        self.evictions = 0
        self.generation = 0  # which models pipelines run on: any load or release moves it
        self._entries: OrderedDict[bytes, tuple[Scope, TensorDict, int]] = OrderedDict()
        self._by_scope: dict[Scope, set[bytes]] = {}
        self._composite: set[Scope] = set()  # scopes of pipelines (their steps may change)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> TensorDict | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, scope: Scope, key: bytes, outputs: TensorDict, composite: bool = False
            ) -> bool:
        """Store a copy of the outputs under key; False when they alone exceed the cache."""
        stored = {name: _frozen_copy(array) for name, array in outputs.items()}
        size = ENTRY_OVERHEAD_BYTES + sum(_nbytes(array) for array in stored.values())
        if size > self.capacity:
            return False
        self._drop(key)
        while self.bytes + size > self.capacity:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        self._entries[key] = (scope, stored, size)
        self._by_scope.setdefault(scope, set()).add(key)
        if composite:
            self._composite.add(scope)
        self.bytes += size
        return True

    def forget(self, scope: Scope) -> None:
        """Drop every entry of one loaded version."""
        for key in list(self._by_scope.get(scope, ())):
            self._drop(key)

    def forget_composites(self) -> None:
        """Drop every pipeline's entries (a model they may run on changed); a pipeline's
        request that started before this stores its result under the old generation, where
        no later request looks."""
        self.generation += 1
        for scope in list(self._composite):
            self.forget(scope)

    def _drop(self, key: bytes) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        scope, _, size = entry
        self.bytes -= size
        keys = self._by_scope[scope]
        keys.discard(key)
        if not keys:
            del self._by_scope[scope]
            self._composite.discard(scope)


def request_key(scope: Scope, request: InferRequest, generation: int = 0) -> bytes:
    """A 128-bit digest of what the request's result depends on (inputs in name order)."""
    digest = hashlib.blake2b(repr((scope, generation)).encode(), digest_size=16)
    for name in sorted(request.inputs):
        array = request.inputs[name]
        digest.update(repr((name, array.dtype.str, array.shape)).encode())
        if array.dtype == object:
            digest.update(encode_bytes_elements(array))
        else:
            digest.update(np.ascontiguousarray(array).data)
    parameters = sorted((key, type(value).__name__, repr(value))
                        for key, value in request.parameters.items()
                        if key not in TRANSPORT_PARAMETERS)
    digest.update(repr(parameters).encode())
    return digest.digest()


async def cached(cache: ResponseCache, scope: Scope, composite: bool, request: InferRequest,
                 stats: ModelStats, run: Callable[[], Awaitable[TensorDict]]) -> TensorDict:
    """The request's outputs from the cache, or from `run` (then stored); counted as Triton's
    statistics count them (cache_hit: lookup; cache_miss: lookup and insert)."""
    started_ns = time.perf_counter_ns()
    key = request_key(scope, request, cache.generation if composite else 0)
    outputs = cache.get(key)
    if outputs is not None:
        stats.record_cache(hit=True, duration_ns=time.perf_counter_ns() - started_ns)
        return dict(outputs)  # the stored dict stays as stored
    lookup_ns = time.perf_counter_ns() - started_ns
    outputs = await run()
    started_ns = time.perf_counter_ns()
    cache.put(scope, key, outputs, composite)
    stats.record_cache(hit=False, duration_ns=lookup_ns + time.perf_counter_ns() - started_ns)
    return outputs


def _frozen_copy(array: np.ndarray) -> np.ndarray:
    """A compact copy nobody can write to (a view would hold its whole batch's memory)."""
    copy = np.array(array, copy=True, order="C")
    copy.flags.writeable = False
    return copy


def _nbytes(array: np.ndarray) -> int:
    if array.dtype != object:
        return int(array.nbytes)
    return int(array.nbytes) + sum(_element_bytes(item) for item in array.flat)


def _element_bytes(item: Any) -> int:
    return len(item) if isinstance(item, (bytes, str)) else 64
