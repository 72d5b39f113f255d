"""Streamed inference over the data plane: a decoupled model's 0..n responses to one request,
as the model sends them, each with its final flag (transport-neutral; gRPC's ModelStreamInfer
serves it).

The request is admitted, counted in flight and validated as DataPlane.infer does it, holds its
model's lease until its final response, and runs through the model's runner (queued, batched,
dropped if its deadline passes while queued). Closing the iterator early (the client went
away) cancels the request in the model.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from serval.backends.validation import validate_request
from serval.batching.responses import DEFAULT_WINDOW, stream_responses
from serval.dataplane import DataPlane
from serval.errors import InvalidInput, ModelNotReady, ServalError
from serval.protocol.types import InferRequest, InferResponse, TensorDict
from serval.repository.names import not_ready_message


@dataclass(frozen=True, slots=True)
class StreamedResponse:
    """One response of a request's stream: outputs (`response`, empty for an error or a bare
    final flag), or the model's error for it; `final`: the request gets no more."""

    response: InferResponse
    error: ServalError | None
    final: bool

    @property
    def bare(self) -> bool:
        """The final flag alone: no outputs, no error."""
        return self.error is None and not self.response.outputs


def decoupled_now(dataplane: DataPlane, name: str, version: str | None) -> bool | None:
    """Whether the model is decoupled, when that is known without a load (None: it is not
    loaded); False when it cannot be reached (a unary path then says why)."""
    try:
        served = dataplane.registry.get(name, version)
    except ServalError:
        return False
    return served.model.metadata.decoupled if served.model is not None else None


async def is_decoupled(dataplane: DataPlane, name: str, version: str | None) -> bool:
    """Whether the model (loaded on a miss) is decoupled; False when it cannot be reached."""
    known = decoupled_now(dataplane, name, version)
    if known is not None:
        return known
    try:
        async with dataplane.registry.acquire(name, version) as served:
            return served.model is not None and served.model.metadata.decoupled
    except ServalError:
        return False


async def infer_stream(dataplane: DataPlane, name: str, version: str | None,
                       request: InferRequest, received_ns: int,
                       deadline_ns: int | None = None, window: int = DEFAULT_WINDOW
                       ) -> AsyncGenerator[StreamedResponse, None]:
    """The model's responses to `request` until its final one; a ServalError before the
    first when the request cannot run (unknown model, invalid inputs, overload)."""
    dataplane.admit(name, version, deadline_ns, "timeout" in request.parameters)
    with dataplane.in_flight(request, received_ns, deadline_ns) as deadline_ns:
        async with dataplane.registry.acquire(name, version) as served:
            if served.model is None or served.runner is None:
                raise ModelNotReady(not_ready_message(served))
            if not served.model.metadata.decoupled:  # reloaded since the caller looked
                raise ModelNotReady(f"model '{name}' was reloaded and is no longer decoupled; "
                                    "send the request again")
            validate_request(request, served.model.metadata, name)
            _refuse_shared_memory_outputs(request, name)
            outcome = "cancelled"
            try:
                async with contextlib.aclosing(stream_responses(
                        served.runner, request.inputs, deadline_ns, request, window)) as stream:
                    async for item in stream:
                        if item.final:
                            outcome = item.error.code.value if item.error else "success"
                        outputs = _selected(item.outputs or {}, request)
                        yield StreamedResponse(
                            InferResponse(name, served.version, outputs, request.id),
                            item.error, item.final)
            finally:
                served.stats.record_request(outcome, time.perf_counter_ns() - received_ns)


async def model_stream(dataplane: DataPlane, name: str, version: str | None,
                       request: InferRequest, deadline_ns: int | None
                       ) -> AsyncGenerator[tuple[TensorDict | ServalError, bool], None]:
    """A model's responses as a BLS call with decoupled=True iterates them (the registry's
    StreamPath): a decoupled model's each with its final flag, any other model's one answer;
    a ServalError when the request cannot run."""
    received_ns = time.perf_counter_ns()
    if not await is_decoupled(dataplane, name, version):
        response = await dataplane.infer(name, version, request, received_ns, deadline_ns)
        yield response.outputs, True
        return
    async with contextlib.aclosing(infer_stream(dataplane, name, version, request, received_ns,
                                                deadline_ns)) as stream:
        async for item in stream:
            yield (item.error if item.error is not None else item.response.outputs), item.final


def _refuse_shared_memory_outputs(request: InferRequest, name: str) -> None:
    """A decoupled model's responses each carry their outputs: a region would be overwritten
    by every response before the client could read it."""
    for output in request.outputs or ():
        if output.shared_memory is not None:
            raise InvalidInput(
                f"output '{output.name}' of decoupled model '{name}' is asked for in shared "
                "memory; a decoupled model's outputs come in its responses (each response "
                "would overwrite the region): ask for them without shared memory")


def _selected(outputs: TensorDict, request: InferRequest) -> TensorDict:
    if not request.outputs or not outputs:
        return outputs
    return {o.name: outputs[o.name] for o in request.outputs if o.name in outputs}
