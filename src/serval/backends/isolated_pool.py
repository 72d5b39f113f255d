"""`instance_group { count: N }` of a model in worker processes: N children, as Triton starts a
Python-backend stub process per instance.

Each child runs one batch at a time; the batcher's N consumers call at once and each batch
takes a free child, so a model that holds the GIL (pure-Python execute()) runs N batches in
parallel instead of one after another. The children start together (a load takes about as long
as one child's) and a child that dies is restarted on its own, the others serving on.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from serval.backends.base import LoadedModel, ModelMetadata, RequestModel
from serval.errors import ServalError
from serval.protocol.types import InferRequest, TensorDict

M = TypeVar("M", bound=LoadedModel)
R = TypeVar("R")


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
