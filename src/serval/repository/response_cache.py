"""Triton's response cache (`--cache-config local,size=N`; a model opts in with config.pbtxt's
`response_cache { enable: true }` or config.yaml's `response_cache: true`).

A request's key hashes what its result depends on: the model version as loaded (name, version,
and which load of it), every input's name, datatype, shape and bytes, and its request
parameters but those that only steer transport (timeout, priority, binary output). A hit
answers with the outputs stored by the first request of that key, without running the model;
a miss runs it and stores the outputs (a compact, read-only copy). Entries are evicted least
recently used first, the sum of their bytes bounded by the cache's size; a result larger than
the whole cache is not stored. A model may compute only the outputs asked for (a Python
model's requested_output_names()): an entry that lacks one asked for is a miss, and the run's
outputs join the entry's. A version's entries go when it is released (unloaded, replaced,
evicted); a composite's (a pipeline, or a model seen calling others through BLS) also go
whenever any model loads or is released, since what it calls may have changed (a BLS model's
first request after a load stores under the plain key: a miss for the next one). Everything
runs on the event loop (no locks) but the hashing of large inputs.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence

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
        self._callers: set[Scope] = set()  # loaded versions seen calling other models (BLS)

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
        size = ENTRY_OVERHEAD_BYTES + sum(
            array.nbytes if array.dtype != object else _object_bytes(array)
            for array in stored.values())
        if size > self.capacity:
            return False
        if key in self._entries:
            self._drop(key)
        while self.bytes + size > self.capacity:
            self._drop(next(iter(self._entries)))
            self.evictions += 1
        self._entries[key] = (scope, stored, size)
        keys = self._by_scope.get(scope)
        if keys is None:
            keys = self._by_scope[scope] = set()
        keys.add(key)
        if composite or scope in self._callers:
            self._composite.add(scope)
        self.bytes += size
        return True

    def forget(self, scope: Scope) -> None:
        """Drop every entry of one loaded version."""
        for key in list(self._by_scope.get(scope, ())):
            self._drop(key)

    def release(self, scope: Scope) -> None:
        """A loaded version goes: its entries, and what was known of it."""
        self.forget(scope)
        self._callers.discard(scope)

    def calls_others(self, scope: Scope) -> None:
        """The version runs other models (a BLS call): from now on it is a composite, its
        entries dropped whenever any model changes. An entry its calling request stores
        after this joins them."""
        self._callers.add(scope)
        if scope in self._by_scope:
            self._composite.add(scope)

    def is_composite(self, scope: Scope, pipeline: bool) -> bool:
        return pipeline or scope in self._callers

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
    """A 128-bit digest of what the request's result depends on (inputs in name order).
    SHA-256 cut to 16 bytes: CPUs with SHA extensions hash it in hardware (1.7 GB/s on the
    development box, BLAKE2b 0.9)."""
    digest = hashlib.sha256(f"{scope}{generation}".encode())
    inputs = request.inputs
    for name in sorted(inputs) if len(inputs) > 1 else inputs:
        array = inputs[name]
        digest.update(f"\0{name}\0{array.dtype.str}{array.shape}".encode())
        if array.dtype.hasobject:
            digest.update(encode_bytes_elements(array))
        else:
            digest.update(np.ascontiguousarray(array).data)
    parameters = request.parameters
    if parameters and not parameters.keys() <= TRANSPORT_PARAMETERS:
        digest.update(repr(sorted(
            (key, type(value).__name__, repr(value)) for key, value in parameters.items()
            if key not in TRANSPORT_PARAMETERS)).encode())
    return digest.digest()[:16]


OFF_LOOP_BYTES = 1 << 20  # larger inputs are hashed on a thread (~0.6 ms of loop per MiB)


async def look_up(cache: ResponseCache, scope: Scope, composite: bool, request: InferRequest,
                  stats: ModelStats, every_output: Sequence[str] = ()) -> Lookup:
    """The request's lookup (`every_output`: the model's outputs, what a request that names
    none asks for). Inputs over OFF_LOOP_BYTES are hashed on a thread (SHA-256 releases the
    GIL), so a large request does not stall every other one on the loop."""
    started_ns = time.perf_counter_ns()
    generation = cache.generation if composite else 0
    if sum(array.nbytes for array in request.inputs.values()) > OFF_LOOP_BYTES:
        key = await asyncio.to_thread(request_key, scope, request, generation)
    else:
        key = request_key(scope, request, generation)
    wanted = ([output.name for output in request.outputs] if request.outputs
              else list(every_output))
    return Lookup(cache, scope, composite, key, stats, started_ns, wanted)


class Lookup:
    """One request's cache lookup: its key and, on a hit, the outputs (`store` after a miss)."""

    __slots__ = ("cache", "composite", "key", "lookup_ns", "outputs", "partial", "scope",
                 "stats")

    def __init__(self, cache: ResponseCache, scope: Scope, composite: bool, key: bytes,
                 stats: ModelStats, started_ns: int, wanted: list[str] | None = None) -> None:
        self.cache, self.scope, self.composite, self.stats = cache, scope, composite, stats
        self.key = key
        stored = cache.get(key)
        self.partial: TensorDict = {}  # an entry without every output asked for: a miss
        if stored is not None and any(name not in stored for name in wanted or ()):
            self.partial, stored = dict(stored), None
        self.outputs = None if stored is None else dict(stored)  # the entry stays as stored
        self.lookup_ns = time.perf_counter_ns() - started_ns
        if self.outputs is not None:
            stats.record_cache(hit=True, duration_ns=self.lookup_ns)

    def store(self, outputs: TensorDict) -> None:
        """After a miss: keep the model's outputs (counted as Triton counts a miss: lookup
        and insert)."""
        started_ns = time.perf_counter_ns()
        self.cache.put(self.scope, self.key, {**self.partial, **outputs}, self.composite)
        self.stats.record_cache(hit=False, duration_ns=self.lookup_ns
                                + time.perf_counter_ns() - started_ns)


def _frozen_copy(array: np.ndarray) -> np.ndarray:
    """A compact copy nobody can write to (a view would hold its whole batch's memory)."""
    copy = array.copy()
    copy.flags.writeable = False
    return copy


def _object_bytes(array: np.ndarray) -> int:
    """A BYTES tensor's size: its references and each element's bytes (64 for other objects)."""
    return int(array.nbytes) + sum(len(item) if isinstance(item, (bytes, str)) else 64
                                   for item in array.flat)
