"""GRPCInferenceService: each RPC decodes, calls the data plane, and encodes; nothing else."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from google.protobuf import json_format

from serval.auth import Action, TokenStore, bearer
from serval.dataplane import DataPlane
from serval.errors import InvalidInput, ServalError
from serval.protocol.grpc import grpc_service_pb2 as pb
from serval.protocol.grpc.codec import decoded, encode_infer_response
from serval.repository.names import cut
from serval.server.grpc.errors import grpc_error, unexpected_grpc_error
from serval.server.grpc.shm_servicer import SharedMemoryRpcs
from serval.server.grpc.stream_infer import (
    FINAL_RESPONSE,
    StreamCall,
    decoupled_stream,
    model_is_decoupled,
    stream_error,
)
from serval.server.statistics import statistics_message
from serval.server.streams import decoupled_now

Reply = TypeVar("Reply")
Context = Any  # serval.server.grpc.calls.CallContext (grpc.aio.ServicerContext's shape)
_STREAM_SLOTS = 128  # requests of one stream in flight, when the context does not say


class InferenceServicer(SharedMemoryRpcs):
    """The v2 gRPC API over one DataPlane: a method for every RPC of the service, by its name."""

    SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    MESSAGES = pb

    def __init__(self, dataplane: DataPlane, auth: TokenStore | None = None) -> None:
        self.dataplane = dataplane
        self.auth = auth  # None: no authentication; liveness and readiness stay open

    async def ServerLive(self, request: Any, context: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.dataplane.live())

    async def ServerReady(self, request: Any, context: Context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.dataplane.ready())

    async def ServerMetadata(self, request: Any, context: Context) -> Any:
        await self._authorize(context, Action.READ)
        return json_format.ParseDict(self.dataplane.server_metadata(),
                                     pb.ServerMetadataResponse())

    async def ModelReady(self, request: Any, context: Context) -> pb.ModelReadyResponse:
        await self._authorize(context, Action.READ, request.name)
        return await _answer(context, "ModelReady", lambda: pb.ModelReadyResponse(
            ready=self.dataplane.model_ready(request.name, request.version or None)))

    async def ModelMetadata(self, request: Any, context: Context) -> Any:
        await self._authorize(context, Action.READ, request.name)
        metadata = await _await(context, "ModelMetadata", self.dataplane.model_metadata(
            request.name, request.version or None))
        return json_format.ParseDict(metadata, pb.ModelMetadataResponse())

    async def ModelConfig(self, request: Any, context: Context) -> Any:
        await self._authorize(context, Action.READ, request.name)
        config = await _await(context, "ModelConfig", self.dataplane.model_config(
            request.name, request.version or None))
        return json_format.ParseDict({"config": config}, pb.ModelConfigResponse())

    async def ModelStatistics(self, request: Any, context: Context) -> Any:
        await self._authorize(context, Action.READ, request.name)
        return await _await(context, "ModelStatistics", statistics_message(
            self.dataplane, request.name or None, request.version or None))

    async def ModelInfer(self, request: Any, context: Context) -> pb.ModelInferResponse:
        await self._authorize(context, Action.INFER, request.model_name)
        try:
            return await self._infer(request, _deadline_ns(context))
        except ServalError as exc:
            await context.abort(*grpc_error(exc, "ModelInfer"))
        except Exception as exc:  # a bug: answer INTERNAL, keep serving
            await context.abort(*unexpected_grpc_error(exc, "ModelInfer"))
        raise AssertionError("unreachable: abort raises")

    async def ModelStreamInfer(
        self, requests: AsyncIterator[Any], context: Context
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Requests of one stream run concurrently (so they batch); a model that is not
        decoupled answers in request order, a decoupled one as it sends its responses
        (server/grpc/stream_infer.py says how, and what bounds a stream)."""
        token = _token(context)
        call = StreamCall(
            functools.partial(self._stream_one, token=token),
            functools.partial(self._decoupled, token=token),
            functools.partial(decoupled_stream, self.dataplane),
            context, getattr(context, "max_stream_messages", _STREAM_SLOTS))
        async with contextlib.aclosing(call.answers(requests)) as answers:
            async for answer in answers:
                yield answer

    async def RepositoryIndex(self, request: Any, context: Context) -> Any:
        await self._authorize(context, Action.READ)
        model = pb.RepositoryIndexResponse.ModelIndex
        async with self.dataplane.loop_share.turn():  # over every model
            index = self.dataplane.repository_index(ready_only=request.ready)
            # built as messages (json_format.ParseDict took 0.3 s of the loop for 10,000)
            return pb.RepositoryIndexResponse(models=[model(**entry) for entry in index])

    async def RepositoryModelLoad(self, request: Any, context: Context) -> Any:
        await self._authorize(context, Action.ADMIN)
        await _await(context, "RepositoryModelLoad", self._load(request))
        return pb.RepositoryModelLoadResponse()

    async def LogSettings(self, request: Any, context: Context) -> pb.LogSettingsResponse:
        """Triton's logging extension: no settings read them; settings change those named
        (admin), and the answer is all of them."""
        await self._authorize(context, Action.ADMIN if request.settings else Action.READ)
        return await _answer(context, "LogSettings", lambda: _log_response(
            self.dataplane.log_settings(_log_changes(request) if request.settings else None)))

    async def TraceSetting(self, request: Any, context: Context) -> pb.TraceSettingResponse:
        """Triton's trace extension, global or `model_name`'s. No settings read them (as
        tritonclient's get_trace_settings sends it, model or not); a setting with no value
        clears it."""
        await self._authorize(context, Action.ADMIN if request.settings else Action.READ)
        changes = {name: list(setting.value) or None
                   for name, setting in request.settings.items()} if request.settings else None
        return await _answer(context, "TraceSetting", lambda: _trace_response(
            self.dataplane.trace_settings(request.model_name or None, changes)))

    async def _unload(self, request: Any) -> None:
        """Unload; Triton's `unload_dependents` (bool_param) takes a pipeline's steps too."""
        dependents = request.parameters.get("unload_dependents")
        if dependents is not None and dependents.WhichOneof("parameter_choice") != "bool_param":
            raise InvalidInput("parameter 'unload_dependents' must be a bool_param")
        await self.dataplane.unload_model(request.model_name,
                                          dependents is not None and dependents.bool_param)

    async def _load(self, request: Any) -> None:
        """Load with `config` (string_param) and 'file:<path>' overrides (bytes_param)."""
        override, files, name = None, {}, cut(request.model_name)
        for key, parameter in request.parameters.items():
            choice = parameter.WhichOneof("parameter_choice")
            if key == "config":
                if choice not in ("string_param", "bytes_param"):  # not read as "" (no JSON)
                    raise InvalidInput(f"failed to load '{name}': parameter 'config' must be a "
                                       "string_param (the config as JSON text), got "
                                       f"{choice or 'no value'}")
                override = parameter.string_param or parameter.bytes_param.decode(
                    errors="replace")
            elif key.startswith("file:"):
                if choice != "bytes_param":
                    raise InvalidInput(f"failed to load '{name}': parameter {key[:80]!r} must "
                                       "be a bytes_param (the file's bytes)")
                files[key] = parameter.bytes_param
        await self.dataplane.load_model(request.model_name, override, files)

    async def RepositoryModelUnload(self, request: Any, context: Context) -> Any:
        await self._authorize(context, Action.ADMIN)
        await _await(context, "RepositoryModelUnload", self._unload(request))
        return pb.RepositoryModelUnloadResponse()

    async def _infer(self, request: Any, deadline_ns: int | None) -> pb.ModelInferResponse:
        received_ns = time.perf_counter_ns()
        self.dataplane.admit(request.model_name, request.model_version or None, deadline_ns,
                             "timeout" in request.parameters)
        infer_request = await decoded(request)
        response = await self.dataplane.infer(
            request.model_name, request.model_version or None, infer_request, received_ns,
            deadline_ns=deadline_ns,
        )
        return encode_infer_response(response)

    async def _authorize(self, context: Context, action: Action, model: str = "") -> None:
        if self.auth is None:
            return
        try:
            self.auth.check(_token(context), action, model)
        except ServalError as exc:
            await context.abort(*grpc_error(exc, action.value))

    def _decoupled(self, request: Any, token: str | None) -> bool | Awaitable[bool]:
        """Whether a stream request reaches a decoupled model (not when it may not infer:
        its one answer says so); an awaitable only when that takes loading the model."""
        try:
            if self.auth is not None:
                self.auth.check(token, Action.INFER, request.model_name)
        except ServalError:
            return False
        known = decoupled_now(self.dataplane, request.model_name, request.model_version or None)
        return known if known is not None else model_is_decoupled(self.dataplane, request)

    async def _stream_one(self, request: Any, token: str | None) -> pb.ModelStreamInferResponse:
        """One stream request's answer: its response, or an error that names the request (id,
        model) as Triton's do; both marked `triton_final_response` (one answer per request)."""
        try:
            if self.auth is not None:
                self.auth.check(token, Action.INFER, request.model_name)
            answer = pb.ModelStreamInferResponse(
                infer_response=await self._infer(request, None))
        except ServalError as exc:
            answer = stream_error(request, grpc_error(exc, "ModelStreamInfer")[1])
        except Exception as exc:
            answer = stream_error(request, unexpected_grpc_error(exc, "ModelStreamInfer")[1])
        answer.infer_response.parameters[FINAL_RESPONSE].bool_param = True
        return answer


async def _answer(context: Context, rpc: str, build: Callable[[], Reply]) -> Reply:
    """Run a synchronous data-plane call; domain errors become their status codes."""
    try:
        return build()
    except ServalError as exc:
        await context.abort(*grpc_error(exc, rpc))
    raise AssertionError("unreachable: abort raises")


async def _await(context: Context, rpc: str, pending: Awaitable[Reply]) -> Reply:
    """Await a data-plane call; domain errors become their status codes."""
    try:
        return await pending
    except ServalError as exc:
        await context.abort(*grpc_error(exc, rpc))
    raise AssertionError("unreachable: abort raises")


def _log_changes(request: Any) -> dict[str, object]:
    """A LogSettingsRequest's settings as Python values (bool, int, str)."""
    changes: dict[str, object] = {}
    for name, setting in request.settings.items():
        kind = setting.WhichOneof("parameter_choice")
        if kind is None:
            raise InvalidInput(f"log setting '{name[:64]}' has no value")
        changes[name] = getattr(setting, kind)
    return changes


def _log_response(settings: dict[str, Any]) -> pb.LogSettingsResponse:
    response = pb.LogSettingsResponse()
    for name, value in settings.items():
        entry = response.settings[name]
        if isinstance(value, bool):
            entry.bool_param = value
        elif isinstance(value, int):
            entry.uint32_param = value
        else:
            entry.string_param = str(value)
    return response


def _trace_response(settings: dict[str, Any]) -> pb.TraceSettingResponse:
    response = pb.TraceSettingResponse()
    for name, value in settings.items():
        response.settings[name].value.extend([value] if isinstance(value, str) else value)
    return response


def _token(context: Context) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            return bearer(value)
    return None


def _deadline_ns(context: Context) -> int | None:
    remaining_s = context.time_remaining()
    if remaining_s is None:
        return None
    return time.perf_counter_ns() + int(remaining_s * 1e9)



