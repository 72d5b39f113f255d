"""Running a generator's shares: one per OS process, each on its own event loop, results merged.

With one share it runs in the calling process. Otherwise each share runs in a forked child (spawned
where fork is missing) and sends back its part; a child that fails, or outlives `bound_s`, is
reported as a ``generator_*`` error instead of hanging the caller.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import queue
import signal
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, cast

Part = dict[str, Any]


def run_shares(share: Callable[..., Part], args: Sequence[tuple[Any, ...]], bound_s: float,
               synchronized: bool = False) -> list[Part]:
    """share(*a) for each a; with `synchronized`, share(*a, barrier) (None when in-process),
    so that the shares can start their clocks together."""
    if len(args) == 1:
        return [share(*args[0], None) if synchronized else share(*args[0])]
    methods = multiprocessing.get_all_start_methods()
    context: Any = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    extra = (context.Barrier(len(args)),) if synchronized else ()
    results = context.Queue()
    children = [context.Process(target=_child, args=(share, (*a, *extra), results), daemon=True)
                for a in args]
    for child in children:
        child.start()
    deadline = time.monotonic() + bound_s
    parts = [_collect(results, deadline) for _ in children]
    for child in children:
        child.join(timeout=max(0.1, deadline - time.monotonic()))
        if child.is_alive():
            child.kill()
            child.join()
    return parts


def run_loop(main: Coroutine[Any, Any, Part]) -> Part:
    """Run a generator's coroutine on a fresh event loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def _child(share: Callable[..., Part], args: tuple[Any, ...], results: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: no trace
    try:
        part = share(*args)
    except Exception as exc:  # report, never hang the parent
        part = {"errors": {f"generator_{type(exc).__name__}": 1}}
    results.put(part)


def _collect(results: Any, deadline: float) -> Part:
    try:
        return cast(Part, results.get(timeout=max(0.1, deadline - time.monotonic())))
    except queue.Empty:
        return {"errors": {"generator_lost": 1}}
