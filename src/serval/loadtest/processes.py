"""Running one generator share per OS process, each on its own event loop (uvloop if present)."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

Part = dict[str, Any]


def run_shares(share: Callable[..., Part], args: Sequence[tuple[Any, ...]]) -> list[Part]:
    """share(*a) for each a: in this process when there is one, else in forked children."""
    if len(args) == 1:
        return [share(*args[0])]
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with context.Pool(len(args)) as pool:
        return pool.starmap(share, args)


def run_loop(main: Coroutine[Any, Any, Part]) -> Part:
    """Run a generator's coroutine on a fresh event loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
