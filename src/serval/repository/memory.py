"""Giving memory back to the OS after an eviction, so RSS follows the budget (glibc keeps
freed heap pages unless asked to trim)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


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
