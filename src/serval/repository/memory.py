"""Giving memory back to the OS after an eviction, so RSS follows the budget (glibc keeps
freed heap pages unless asked to trim)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import gc
import os
import time
from collections.abc import Callable

TRIM_INTERVAL_S = 0.25
# How often, while models load, frozen objects are thawed for one full collection (see
# MemoryKeeper.after_load): ~100 ms at 10,000 loaded models, a few ms for tens.
RECLAIM_INTERVAL_S = 10.0
# glibc gives each thread that mallocs concurrently an arena of its own (up to 8 per core):
# model loads on to_thread workers, engine threads and ONNX Runtime's threads each fragment
# theirs, and malloc_trim cannot give back what fragmentation pins. With the arenas capped,
# RSS stays flat over tens of thousands of evictions (it grew ~1 KiB per eviction before:
# +10% over a 90 s churn of 14,500 evictions; flat with 2 arenas).
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # mallopt parameter (malloc.h)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (before threads start), unless MALLOC_ARENA_MAX says
    otherwise; True if the cap was set."""
    libc = _libc()
    if libc is None or "MALLOC_ARENA_MAX" in os.environ or not hasattr(libc, "mallopt"):
        return False
    return bool(libc.mallopt(_M_ARENA_MAX, arenas))


def return_freed_memory() -> None:
    """malloc_trim(0) where glibc provides it; a no-op elsewhere (musl, jemalloc, macOS)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class MemoryKeeper:
    """Trims the heap in a worker thread at most 4 times a second (a trim of a large heap takes
    tens of ms) and keeps loaded models' long-lived objects out of the GC's full passes."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        limit_malloc_arenas()  # the registry is built before any engine or loader thread
        self._clock = clock
        self._last_reclaim = clock()
        self._frozen_since_reclaim = False
        self._last_trim = 0.0
        self._trimming: asyncio.Task[None] | None = None
        self._reserved: dict[object, int] = {}  # bytes of each load under way, by version

    def reserve(self, version: object, nbytes: int) -> None:
        """Hold `nbytes` of the budget for a version while it loads (before it is READY its
        bytes are not resident yet, and concurrent loads would each count the same room)."""
        self._reserved[version] = nbytes

    def settle(self, version: object) -> None:
        """The load is over: its bytes are resident now, or it failed."""
        self._reserved.pop(version, None)

    def reserved(self, besides: object) -> int:
        """Bytes held for loads under way other than `besides`."""
        return sum(n for version, n in self._reserved.items() if version is not besides)

    def after_eviction(self) -> None:
        now = self._clock()
        if self._trimming is None and now - self._last_trim >= TRIM_INTERVAL_S:
            self._last_trim = now
            self._trimming = asyncio.ensure_future(asyncio.to_thread(return_freed_memory))
            self._trimming.add_done_callback(self._trimmed)

    def after_load(self) -> None:
        # A loaded model's objects live until eviction: scanning them in every full
        # collection costs ~100 ms pauses at 10,000 models. Refcounting still frees them.
        # But freezing takes every object alive now out of the collector's reach, not only
        # the model's: garbage cycles not collected yet, and live ones that become garbage
        # later (a connection open during the load, closed after it; a request's exception
        # and traceback). Frozen, they leaked: +22% RSS in 90 s of evictions beside 120,000
        # short connections. So collect before freezing (only what is not frozen yet is
        # scanned: cheap), and every RECLAIM_INTERVAL_S thaw everything for one full pass.
        now = self._clock()
        if self._frozen_since_reclaim and now - self._last_reclaim >= RECLAIM_INTERVAL_S:
            gc.unfreeze()
            self._last_reclaim = now
        gc.collect()
        gc.freeze()
        self._frozen_since_reclaim = True

    def _trimmed(self, _task: asyncio.Task[None]) -> None:
        self._trimming = None
