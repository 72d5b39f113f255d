"""Giving memory back to the OS after an eviction, so RSS follows the budget (glibc keeps
freed heap pages unless asked to trim)."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import gc
import time

TRIM_INTERVAL_S = 0.25


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


def return_freed_memory() -> None:
    """malloc_trim(0) where glibc provides it; a no-op elsewhere (musl, jemalloc, macOS)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


class MemoryKeeper:
    """Trims the heap in a worker thread at most 4 times a second (a trim of a large heap takes
    tens of ms) and keeps loaded models' long-lived objects out of the GC's full passes."""

    def __init__(self) -> None:
        self._last_trim = 0.0
        self._trimming: asyncio.Task[None] | None = None

    def after_eviction(self) -> None:
        now = time.monotonic()
        if self._trimming is None and now - self._last_trim >= TRIM_INTERVAL_S:
            self._last_trim = now
            self._trimming = asyncio.ensure_future(asyncio.to_thread(return_freed_memory))
            self._trimming.add_done_callback(self._trimmed)

    def after_load(self) -> None:
        # A loaded model's objects live until eviction: scanning them in every full
        # collection costs ~100 ms pauses at 10,000 models. Refcounting still frees them.
        gc.freeze()

    def _trimmed(self, _task: asyncio.Task[None]) -> None:
        self._trimming = None
