"""`isolation: process`: a model's engine runs in a child process (isolated_child.py), restarted
if it dies (later and later if it keeps dying: crash_loop.py); one per instance
(isolated_pool.py).

The parent keeps the LoadedModel protocol; each infer() ships the batch over a pipe as raw
tensor bytes (a small header, then each array's buffer, received straight into numpy memory),
so a crash, even a segfault, fails only that model's in-flight batch. An engine that takes
requests (RequestModel) gets them over the pipe one by one and answers each on its own.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from serval.backends import bls
from serval.backends.base import (
    Engine,
    LoadedModel,
    ModelCaller,
    ModelMetadata,
    ModelVersionSpec,
)
from serval.backends.crash_loop import CrashLoop
from serval.backends.isolated_child import STOP, child_main
from serval.backends.isolated_pool import Instance, one_instance, pooled, start_instances
from serval.backends.pipe_requests import recv_results, send_requests
from serval.backends.pipe_tensors import recv_tensors, send_tensors
from serval.backends.worker_guard import (
    await_reply,
    exit_reason,
    kill_group,
    stop_in_background,
    stop_worker,
)
from serval.errors import (
    BackendError,
    ConfigError,
    EngineRejectedInput,
    ModelNotReady,
    ServalError,
    WorkerHeld,
)
from serval.protocol.types import InferRequest, TensorDict

log = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 5.0
T = TypeVar("T")


class IsolatedBackend:
    """Wraps an engine so that each model version it loads lives in its own process."""

    def __init__(self, inner: Engine, caller: ModelCaller | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.caller = caller  # runs its models' BLS calls on other models

    def load(self, spec: ModelVersionSpec) -> LoadedModel:
        """A worker process per instance, each on its share of the cores."""
        count = spec.config.instances
        if count == 1:
            return self._start(self.inner, spec)
        inner, one = one_instance(self.inner, spec)
        return pooled(start_instances(
            count, lambda index: self._start(inner, replace(one, instance=index))))

    def _start(self, inner: Engine, spec: ModelVersionSpec) -> Instance:
        model = IsolatedModel(inner, spec, caller=self.caller)
        return IsolatedRequestModel(model) if model.takes_requests else model


class IsolatedModel:
    """The parent's handle on one child: infer, restart after a crash, unload. `child_target`
    is the child's main function (child_main's signature)."""

    def __init__(self, inner: Engine, spec: ModelVersionSpec,
                 child_target: Callable[[Connection, Engine, ModelVersionSpec], None] | None
                 = None, caller: ModelCaller | None = None) -> None:
        self._inner, self._spec = inner, spec
        self._child_target = child_target or child_main
        self.name = spec.name
        self.label = f"model '{spec.name}' version {spec.version}"
        self.caller = caller
        self.abandon = threading.Event()  # set on unload: BLS calls stop waiting
        self._lock = threading.Lock()  # one batch on the pipe at a time
        self._send_lock = threading.Lock()  # the batch's writes and its BLS replies' (threads)
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._calls: bls.ParentCalls | None = None  # the live child's BLS calls, answered
        self._closed = False
        self.restarts = 0
        self.crash_loop = CrashLoop()  # a worker that keeps crashing restarts later and later
        self._metadata, self._memory_bytes, self.takes_requests = self._spawn()

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def memory_bytes(self) -> int:
        return self._memory_bytes

    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def held_s(self) -> float | None:
        """None while its worker is up (or it is unloaded); else seconds its crash loop
        holds back a restart (0.0: a batch would start one now)."""
        if self._conn is not None or self._closed:
            return None
        return self.crash_loop.wait_s()

    def infer(self, inputs: TensorDict) -> TensorDict:
        status, detail, outputs = self._exchange(
            lambda conn: send_tensors(conn, inputs), lambda conn, _: recv_tensors(conn))
        if status == "rejected":  # the input's values, not the engine: the client's 400
            message, engine_detail = detail
            raise EngineRejectedInput(message, engine_detail)
        if outputs is None:
            raise RuntimeError(f"{self.label} raised in its worker process: {detail}")
        return outputs

    def run_requests(self, requests: Sequence[InferRequest]) -> list[TensorDict | ServalError]:
        """The batch as its requests, for a child engine that takes requests."""
        _, detail, results = self._exchange(
            lambda conn: send_requests(conn, requests), recv_results, requests)
        if results is None:
            raise RuntimeError(f"{self.label} raised in its worker process: {detail}")
        return results

    def _exchange(self, send: Callable[[Connection], None],
                  receive: Callable[[Connection, Any], T],
                  requests: Sequence[InferRequest] = ()) -> tuple[str, Any, T | None]:
        """One batch on the pipe: (status, detail, what `receive` read when status is ok).
        `requests`: the batch's, whose BLS callers its calls may not call back."""
        with self._lock:
            if self._closed:
                raise ModelNotReady(f"{self.label} is unloaded")
            if self._conn is None:  # held back, or the background restart failed
                self._restart_if_due()
            assert self._conn is not None and self._calls is not None
            calls = self._calls
            calls.running(requests)
            try:
                with self._send_lock:
                    send(self._conn)
                message = self._conn.recv()
                while calls.handle(message):  # the model runs inference on other models
                    message = self._conn.recv()
                status, detail = message
                received = receive(self._conn, detail) if status == "ok" else None
                calls.wait_idle()  # every call answered before the next batch goes down
            except (EOFError, OSError) as exc:
                raise self._crashed() from exc
        return status, detail, received

    def unload(self) -> None:
        """Stop the worker; waited for (and killed past STOP_TIMEOUT_S) in the background."""
        self.abandon.set()  # a batch waiting on a BLS call ends, and frees the pipe
        self._closed = True  # no batch starts from now on
        if self._lock.acquire(blocking=False):
            try:
                self._stop_child()
            finally:
                self._lock.release()
            return
        # A batch holds the pipe (at shutdown: a model that hangs) or a restart is under way.
        # The worker is killed, so the batch fails as a worker that died (no restart follows:
        # closed), and what holds the lock is stopped once it lets go; the loop never waits.
        process = self._process
        if process is not None:
            process.kill()
            kill_group(process)
        threading.Thread(target=self._stop_when_free, daemon=True,
                         name=f"serval-unload-{self._spec.name}").start()

    def _stop_when_free(self) -> None:
        with self._lock:
            self._stop_child()

    def connection(self) -> Connection:
        """The live child's pipe, for a caller that runs its own exchange on it (restarting a
        child that died first)."""
        with self._lock:
            if self._closed:
                raise ModelNotReady(f"{self.label} is unloaded")
            if self._conn is None:
                self._restart_if_due()
            assert self._conn is not None
            return self._conn

    def lost(self, conn: Connection) -> BackendError:
        """The child behind `conn` is gone: reap and restart it (once), say what happened."""
        with self._lock:
            if self._conn is conn and not self._closed:
                return self._crashed()
        return BackendError(f"{self.label}: its worker process stopped")

    # child lifecycle -------------------------------------------------------------------------

    def _spawn(self) -> tuple[ModelMetadata, int, bool]:
        context = multiprocessing.get_context("spawn")
        parent_conn, child_conn = context.Pipe()
        process = context.Process(target=self._child_target,
                                  args=(child_conn, self._inner, self._spec),
                                  name=f"serval-model-{self._spec.name}", daemon=True)
        process.start()
        child_conn.close()
        try:
            reply = await_reply(parent_conn, process, LOAD_TIMEOUT_S)
        except (EOFError, OSError, TimeoutError) as exc:
            process.join(timeout=0.5)  # its exit code, when it has exited on its own
            if process.is_alive():
                process.kill()
            kill_group(process)
            process.join()
            parent_conn.close()
            raise ConfigError(f"{self.label}: its worker process failed while loading "
                              f"({exit_reason(process.exitcode)})") from exc
        if reply[0] != "ready":  # a thread its load started may keep it up: killed past 5 s
            stop_worker(process, STOP_TIMEOUT_S)
            parent_conn.close()
            raise ConfigError(str(reply[1]))
        self._process, self._conn = process, parent_conn
        self._calls = bls.ParentCalls(parent_conn, self.caller, self.label, self.abandon,
                                      self._send_lock, own=self._spec.name)
        self.crash_loop.started()
        log.info("isolated model worker started", extra={
            "model": self._spec.name, "version": self._spec.version, "pid": process.pid})
        return reply[1], int(reply[2]), bool(reply[3])

    def _crashed(self) -> BackendError:
        """Reap the dead child, restart it in the background, and say what happened."""
        process = self._process
        assert process is not None
        process.join(timeout=STOP_TIMEOUT_S)
        reason = exit_reason(process.exitcode)
        kill_group(process)  # what the model started goes with it
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None
        delay_s = self.crash_loop.crashed()
        log.error("isolated model worker died; restarting it", extra={
            "model": self._spec.name, "version": self._spec.version, "pid": process.pid,
            "reason": reason, "crashes_in_a_row": self.crash_loop.crashes,
            "restart_in_s": delay_s})
        threading.Thread(target=self._restart_in_background, args=(delay_s,), daemon=True,
                         name=f"serval-restart-{self._spec.name}").start()
        error = BackendError(f"{self.label}: worker process died ({reason}) during a batch")
        then = (f"it {self.crash_loop.in_a_row()} and restarts in {delay_s:.1f} s" if delay_s
                else "it is being restarted")
        error.public_message = (f"{self.label}: its worker process died ({reason}) while "
                                f"running this request; {then}")
        return error

    def _restart_if_due(self) -> None:
        """Under the lock, with no live child: start one now, unless its crash loop holds the
        restart back (this request then gets a 503 saying when)."""
        wait_s = self.crash_loop.wait_s()
        if wait_s > 0:
            raise WorkerHeld(f"{self.label}: its worker process {self.crash_loop.in_a_row()}; "
                             f"it restarts in {wait_s:.1f} s", wait_s)
        self._restart_locked()

    def _restart_in_background(self, delay_s: float) -> None:
        if self.abandon.wait(delay_s):  # unloaded meanwhile
            return
        with self._lock:
            if self._conn is None and not self._closed:
                with contextlib.suppress(ModelNotReady):  # logged; the next request retries
                    self._restart_locked()

    def _restart_locked(self) -> None:
        try:
            self._metadata, self._memory_bytes, self.takes_requests = self._spawn()
        except ConfigError as exc:
            log.error("isolated model worker failed to restart", extra={
                "model": self._spec.name, "version": self._spec.version, "error": str(exc)})
            raise ModelNotReady(f"{self.label}: its worker process could not be restarted "
                                "(the server log says why)") from exc
        self.restarts += 1

    def _stop_child(self) -> None:
        process, conn = self._process, self._conn
        self._process, self._conn = None, None
        if conn is not None:
            with contextlib.suppress(OSError):  # no lock: a reply stuck on a full pipe
                conn.send((STOP, None))
        stop_in_background(process, conn, STOP_TIMEOUT_S, self._spec.name)


class IsolatedRequestModel:
    """An isolated engine that takes requests (RequestModel): the child gets the batch as
    its list of requests."""

    def __init__(self, model: IsolatedModel) -> None:
        self.isolated = model

    @property
    def metadata(self) -> ModelMetadata:
        return self.isolated.metadata

    def memory_bytes(self) -> int:
        return self.isolated.memory_bytes()

    def held_s(self) -> float | None:
        return self.isolated.held_s()

    def infer(self, inputs: TensorDict) -> TensorDict:
        return self.isolated.infer(inputs)

    def infer_requests(self, requests: Sequence[InferRequest]
                       ) -> list[TensorDict | ServalError]:
        return self.isolated.run_requests(requests)

    def unload(self) -> None:
        self.isolated.unload()
