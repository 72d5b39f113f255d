"""Keeps `--workers N` serving processes up: a worker that dies is restarted; SIGTERM drains all.
A worker that exits with STARTUP_FAILED could not start (a port taken, a bad setting): it would
fail again, so every worker is stopped and the supervisor returns that code."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

log = logging.getLogger(__name__)

RESTART_BACKOFF_MAX_S = 10.0
HEALTHY_AFTER_S = 30.0  # a worker that lived this long resets the crash-loop backoff
STARTUP_FAILED = 78  # EX_CONFIG: a worker that cannot start; not restarted


class Supervisor:
    """Starts N worker processes running `target(*args)` and restarts any that dies unasked."""

    def __init__(self, count: int, target: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.count, self.target, self.args = count, target, args
        self.context = multiprocessing.get_context("spawn")
        self.workers: list[BaseProcess | None] = [None] * count
        self.started_at = [0.0] * count
        self.backoff_s = [0.0] * count
        self.restarts = 0
        self.stopping = False
        self.failed = False  # a worker could not start

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT, then forward it and wait; 0 when every worker exited 0."""
        for slot in range(self.count):
            self._start(slot)
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        while not self.stopping:
            self._watch_once(timeout_s=0.5)
        self._forward(signal.SIGTERM)  # one started during the signal may have missed it
        codes = []
        for worker in self.workers:
            if worker is not None:
                worker.join()
                codes.append(worker.exitcode)
        if self.failed:
            return STARTUP_FAILED
        # a worker stopped by the signal before it installed its handler had nothing in flight
        clean = (0, -signal.SIGTERM, -signal.SIGINT)
        return 0 if all(code in clean for code in codes) else 1

    def _start(self, slot: int) -> None:
        worker = self.context.Process(target=self.target, args=self.args,
                                      name=f"serval-worker-{slot}")
        worker.start()
        self.workers[slot], self.started_at[slot] = worker, time.monotonic()

    def _watch_once(self, timeout_s: float) -> None:
        alive = {w.sentinel: slot for slot, w in enumerate(self.workers) if w is not None}
        for sentinel in wait(list(alive), timeout=timeout_s):
            if self.stopping:
                return
            if isinstance(sentinel, int):
                self._restart(alive[sentinel])

    def _restart(self, slot: int) -> None:
        worker = self.workers[slot]
        assert worker is not None
        worker.join()
        if worker.exitcode == STARTUP_FAILED:
            self.stopping = self.failed = True
            self._forward(signal.SIGTERM)
            return
        lived_s = time.monotonic() - self.started_at[slot]
        backoff_s = 0.0 if lived_s > HEALTHY_AFTER_S else min(
            RESTART_BACKOFF_MAX_S, max(0.5, 2 * self.backoff_s[slot]))
        self.backoff_s[slot] = backoff_s
        log.error("worker process died; restarting it",
                  extra={"worker": slot, "pid": worker.pid, "exitcode": worker.exitcode,
                         "lived_s": round(lived_s, 1), "restart_in_s": backoff_s})
        deadline = time.monotonic() + backoff_s
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.stopping:
            self.restarts += 1
            self._start(slot)

    def _on_stop_signal(self, signum: int, _frame: object) -> None:
        self.stopping = True
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        for worker in self.workers:
            if worker is not None and worker.pid is not None and worker.is_alive():
                os.kill(worker.pid, signum)
