"""Where a version's pipeline steps and BLS calls go: the data plane's per-model path and its
way of streaming a model's responses, which the server hands the registry once built (the
repository sits below the data plane and the server, so it is given them)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable

from serval.errors import ServalError, ServerUnavailable
from serval.protocol.types import InferRequest, InferResponse, TensorDict

# the data plane's per-model path: (model, version, request, received_ns, deadline_ns)
StepPath = Callable[[str, str | None, InferRequest, int, int | None], Awaitable[InferResponse]]
# a model's responses as a stream: (model, version, request, deadline_ns) -> each response's
# outputs or error, with its final flag (server/streams.py: model_stream)
Streamed = AsyncGenerator[tuple[TensorDict | ServalError, bool], None]
StreamPath = Callable[[str, str | None, InferRequest, int | None], Streamed]


class StepRouter:
    """Where pipeline steps and BLS calls go: the data plane's per-model path, and its way of
    streaming a model's responses, once the server routes them here."""

    __slots__ = ("path", "stream_path")

    def __init__(self) -> None:
        self.path: StepPath | None = None
        self.stream_path: StreamPath | None = None

    async def run(self, name: str, version: str | None, request: InferRequest,
                  deadline_ns: int | None) -> InferResponse:
        if self.path is None:
            raise ServerUnavailable("no data plane runs this server's pipeline steps")
        return await self.path(name, version, request, time.perf_counter_ns(), deadline_ns)

    def stream(self, name: str, version: str | None, request: InferRequest,
               deadline_ns: int | None) -> Streamed:
        if self.stream_path is None:
            raise ServerUnavailable("no data plane streams this server's responses")
        return self.stream_path(name, version, request, deadline_ns)
