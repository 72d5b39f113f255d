"""`instance_group { count: N }` of a model in worker processes: N children, as Triton starts a
Python-backend stub process per instance (and an engine with `isolation: process`, each child
with one instance and its share of the cores).

Each child runs one batch at a time; the batcher's N consumers call at once and each batch
takes a free child, so a model that holds the GIL (pure-Python execute()) runs N batches in
parallel instead of one after another. The children start together (a load takes about as long
as one child's) and a child that dies is restarted on its own, the others serving on.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Generic, Protocol, TypeVar, cast

from serval.backends.base import Engine, LoadedModel, ModelMetadata, ModelVersionSpec, RequestModel
from serval.errors import ServalError
from serval.protocol.types import InferRequest, TensorDict

R = TypeVar("R")
_RECHECK_S = 0.05  # a pool waiting on a busy member looks again for a restarted one


class Instance(LoadedModel, Protocol):
    """A pool member: a worker process's handle, which may be held by its crash loop."""

    def held_s(self) -> float | None:
        """None while its worker is up; else seconds until one may start (0.0: now)."""
        ...


M = TypeVar("M", bound=Instance)


def one_instance(engine: Engine, spec: ModelVersionSpec) -> tuple[Engine, ModelVersionSpec]:
    """The engine and spec for one of the spec's instances in a process of its own: one
    instance, on the cores' share that instance would have had in one process (each engine
    sizes its threads from `cores`)."""
    count = spec.config.instances
    share = copy.copy(engine)  # the engine's settings, not its state: it has loaded nothing
    cores = getattr(share, "cores", None)
    if isinstance(cores, int):
        share.cores = max(1, cores // count)  # type: ignore[attr-defined]
    return share, replace(spec, config=spec.config.model_copy(update={"instances": 1}))


def start_instances(count: int, start: Callable[[int], M]) -> list[M]:
    """`count` children started together (`start` gets each one's index); if any fails, those
    started are unloaded and the first failure is raised."""
    if count == 1:
        return [start(0)]
    with ThreadPoolExecutor(count, thread_name_prefix="serval-instance-start") as pool:
        futures = [pool.submit(start, index) for index in range(count)]
    started = [future.result() for future in futures if future.exception() is None]
    failures = [error for future in futures if (error := future.exception()) is not None]
    if failures:
        for model in started:
            model.unload()
        raise failures[0]
    return started


class InstancePool(Generic[M]):
    """Several loaded copies of one model version served as one: a batch runs on a free one
    whose worker is up, else waits for a busy one that is up; only with no worker up does it
    go to one that is restarting or held by its crash loop (see _take)."""

    def __init__(self, members: list[M]) -> None:
        self.members = members
        self._free = list(members)
        self._returned = threading.Condition()

    @property
    def metadata(self) -> ModelMetadata:
        return self.members[0].metadata

    def memory_bytes(self) -> int:
        return sum(member.memory_bytes() for member in self.members)

    def infer(self, inputs: TensorDict) -> TensorDict:
        return self._on_free(lambda member: member.infer(inputs))

    def unload(self) -> None:
        for member in self.members:
            member.unload()

    def _on_free(self, run: Callable[[M], R]) -> R:
        member = self._take()
        try:
            return run(member)
        finally:
            with self._returned:
                self._free.append(member)
                self._returned.notify()

    def _take(self) -> M:
        """A free member whose worker is up; else wait for a busy one that is up (its batch
        is shorter than a restart); else, no worker up, the free member due first: it starts
        its worker for this batch, or its crash loop answers 503 saying when."""
        with self._returned:
            while True:
                holds = [(member.held_s(), member) for member in self._free]
                for held_s, member in holds:
                    if held_s is None:
                        self._free.remove(member)
                        return member
                down = [member for member in self.members if member.held_s() is not None]
                if holds and len(down) == len(self.members):
                    member = min(holds, key=lambda hold: cast(float, hold[0]))[1]
                    self._free.remove(member)
                    return member
                # a busy sibling is up: take it when its batch ends, or a worker restarted
                # meanwhile (checked every _RECHECK_S while some are down)
                self._returned.wait(_RECHECK_S if down else None)


class RequestInstancePool(InstancePool[M]):
    """A pool of engines that take requests (Triton's execute(requests))."""

    def infer_requests(self, requests: Sequence[InferRequest]
                       ) -> list[TensorDict | ServalError]:
        def run(member: M) -> list[TensorDict | ServalError]:
            assert isinstance(member, RequestModel)
            return member.infer_requests(requests)
        return self._on_free(run)


def pooled(members: list[M]) -> LoadedModel:
    """One member as itself; several as the pool their kind needs."""
    if len(members) == 1:
        return members[0]
    if isinstance(members[0], RequestModel):
        return RequestInstancePool(members)
    return InstancePool(members)
