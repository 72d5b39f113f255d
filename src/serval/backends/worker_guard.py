"""A model's worker process, and what its code starts, never outlive their use.

The worker leads a process group of its own, so the processes a model spawns (a `subprocess`
it never waits for) go with it when it stops or dies; and it watches its parent, so a server
killed without unloading it (SIGKILL, the out-of-memory killer) leaves no worker behind
running the model's code. The parent reaps a worker without blocking: unload hands the wait
(the model's finalize(), its threads) to a thread of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

PARENT_POLL_S = 0.5  # how often a worker looks whether its server is still there


def guard_worker() -> None:
    """In the worker, before any model code runs: a process group of its own, and a thread
    that ends the group when the parent is gone."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True,
                     name="serval-parent-watch").start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    if os.getpgid(0) == os.getpid():  # the group is this worker's own: end it all
        os.killpg(0, signal.SIGKILL)
    os._exit(1)


def end_group() -> None:
    """In the worker, as it ends (told to stop, or its parent gone): SIGTERM to the rest of
    its group, which it ignores itself (the parent kills what is left when it reaps it; a
    parent that is gone cannot)."""
    if os.getpgid(0) != os.getpid():
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.killpg(0, signal.SIGTERM)


def stop_worker(process: BaseProcess, grace_s: float) -> None:
    """Wait up to `grace_s` for the worker to exit, kill it if it has not, then kill what
    is left of its process group (looked at before the worker is reaped, so its id is
    still its own) and reap it."""
    if not wait([process.sentinel], grace_s):
        process.kill()
    kill_group(process)
    process.join()


def kill_group(process: BaseProcess) -> None:
    """Kill the processes left in the worker's group (none: nothing happens)."""
    pid = process.pid
    if pid is None:
        return
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)


def stop_in_background(process: BaseProcess | None, conn: Connection | None,
                       grace_s: float, name: str) -> threading.Thread:
    """stop_worker on a thread (not a daemon: the server's exit waits for it), then close the
    pipe; the caller goes on at once (an unload on the event loop never waits on the model's
    finalize())."""
    def stop() -> None:
        try:
            if process is not None:
                stop_worker(process, grace_s)
        finally:
            if conn is not None:
                conn.close()

    thread = threading.Thread(target=stop, name=f"serval-stop-{name}")
    thread.start()
    return thread


def await_reply(conn: Connection, process: BaseProcess, timeout_s: float) -> Any:
    """The worker's first message, within `timeout_s` (EOFError: it exited without one)."""
    deadline = time.monotonic() + timeout_s
    while not conn.poll(0.1):
        if not process.is_alive() and not conn.poll(0):
            raise EOFError("the worker process exited")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no answer in {timeout_s} s")
    return conn.recv()


def exit_reason(exitcode: int | None) -> str:
    """How a worker ended, in words ("exit code 1", "killed by SIGSEGV")."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"
