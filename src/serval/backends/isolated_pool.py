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
import queue
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Generic, TypeVar

from serval.backends.base import Engine, LoadedModel, ModelMetadata, ModelVersionSpec, RequestModel
from serval.errors import ServalError
from serval.protocol.types import InferRequest, TensorDict

M = TypeVar("M", bound=LoadedModel)
R = TypeVar("R")


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


def start_instances(count: int, start: Callable[[], M]) -> list[M]:
    """`count` children started together; if any fails, those started are unloaded and the
    first failure is raised."""
    if count == 1:
        return [start()]
    with ThreadPoolExecutor(count, thread_name_prefix="serval-instance-start") as pool:
        futures = [pool.submit(start) for _ in range(count)]
    started = [future.result() for future in futures if future.exception() is None]
    failures = [error for future in futures if (error := future.exception()) is not None]
    if failures:
        for model in started:
            model.unload()
        raise failures[0]
    return started


class InstancePool(Generic[M]):
    """Several loaded copies of one model version served as one: a batch runs on a free one."""

    def __init__(self, members: list[M]) -> None:
        self.members = members
        self._free: queue.SimpleQueue[M] = queue.SimpleQueue()
        for member in members:
            self._free.put(member)

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
        member = self._free.get()  # never waits: at most `count` consumers call at once
        try:
            return run(member)
        finally:
            self._free.put(member)


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
