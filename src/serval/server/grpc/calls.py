"""Runs gRPC calls against the servicer: method table, request parsing, context, status codes.

The servicer's methods have grpc.aio's shape (`request, context` in; a reply, or an async
iterator of replies, out); `CallContext` is the part of grpc.aio's ServicerContext they use, its
status codes spelled as GrpcStatus.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, NoReturn, Protocol

from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError

from serval.observability.logging import report_internal_error
from serval.protocol.grpc.status import GrpcStatus
from serval.server.grpc.errors import Trailers
from serval.server.grpc.stream import ServerCall

log = logging.getLogger(__name__)

_TIMEOUT_UNITS_NS = {"H": 3_600_000_000_000, "M": 60_000_000_000, "S": 1_000_000_000,
                     "m": 1_000_000, "u": 1_000, "n": 1}


class AbortCall(Exception):
    """Raised by CallContext.abort: the call ends with this status (and trailers)."""

    def __init__(self, code: GrpcStatus, details: str, trailers: Trailers = ()) -> None:
        super().__init__(details)
        self.status, self.details, self.trailers = code, details, trailers


@dataclass(frozen=True)
class Method:
    """One RPC of the service."""

    name: str
    request_type: Any  # a protobuf message class
    client_streaming: bool
    server_streaming: bool
    handler: Callable[..., Any]


class CallContext:
    """What a servicer method may ask of its call."""

    def __init__(self, call: ServerCall) -> None:
        self.call = call
        self.deadline_ns = _deadline_ns(call)

    async def abort(self, code: GrpcStatus, details: str = "",
                    trailing_metadata: Trailers = ()) -> NoReturn:
        raise AbortCall(code, details, trailing_metadata)

    def time_remaining(self) -> float | None:
        if self.deadline_ns is None:
            return None
        return max(0.0, (self.deadline_ns - time.perf_counter_ns()) / 1e9)

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.call.metadata()

    @property
    def max_stream_messages(self) -> int:
        """Requests of one stream that may be received and not yet answered."""
        return self.call.max_messages


class Servicer(Protocol):
    """An object with a method for every RPC of one service, by the RPC's name."""

    @property
    def SERVICE(self) -> ServiceDescriptor:
        """The service it implements."""

    @property
    def MESSAGES(self) -> ModuleType:
        """The generated module holding the service's message classes."""


class ServiceRunner:
    """Maps paths to the servicers' methods and runs each call to its status."""

    def __init__(self, *servicers: Servicer) -> None:
        self.methods = {path: method for servicer in servicers
                        for path, method in service_methods(servicer).items()}

    def is_client_streaming(self, path: str) -> bool | None:
        method = self.methods.get(path)
        return None if method is None else method.client_streaming

    async def run(self, call: ServerCall) -> None:
        method = self.methods[call.path]
        try:
            context = CallContext(call)
            if method.client_streaming:
                requests = _request_stream(call, method.request_type)
            else:
                requests = _parse(method.request_type, _single_message(call))
            if method.server_streaming:
                async for reply in method.handler(requests, context):
                    call.send_message(reply.SerializeToString())
                    if call.backlogged():  # the client reads slower than we answer: wait
                        await call.drain()
                call.finish(GrpcStatus.OK)
            else:
                reply = await method.handler(requests, context)
                call.send_reply(reply.SerializeToString())  # the reply and OK, in one
        except AbortCall as exc:
            call.finish(exc.status, exc.details, exc.trailers)
        except asyncio.CancelledError:
            call.finish(GrpcStatus.CANCELLED, "cancelled")
            raise
        except Exception as exc:  # a bug: answer INTERNAL, keep serving
            call.finish(GrpcStatus.INTERNAL, report_internal_error(exc, method.name,
                                                        "internal server error", repr(exc)))


def service_methods(servicer: Servicer) -> dict[str, Method]:
    """Every RPC of the servicer's service, bound to its method of the same name."""
    service = servicer.SERVICE
    return {
        f"/{service.full_name}/{rpc.name}": Method(
            rpc.name, getattr(servicer.MESSAGES, rpc.input_type.name), rpc.client_streaming,
            rpc.server_streaming, getattr(servicer, rpc.name))
        for rpc in service.methods
    }


_TRUNCATED = "the request ended inside a message (its length prefix announced more)"


def _single_message(call: ServerCall) -> bytes:
    if call.assembling:  # grpc-go: INTERNAL (unexpected EOF); the client's fault here
        raise AbortCall(GrpcStatus.INVALID_ARGUMENT, _TRUNCATED)
    message = call.next_message() if call.message_count == 1 else None
    if message is None:
        raise AbortCall(GrpcStatus.INVALID_ARGUMENT,
                        f"a unary call carries exactly one request message, not "
                        f"{call.message_count}")
    return message


def _parse(request_type: Any, message: bytes) -> Any:
    try:
        return request_type.FromString(message)
    except DecodeError:
        raise AbortCall(GrpcStatus.INVALID_ARGUMENT,
                        f"the request is not a valid {request_type.DESCRIPTOR.full_name} "
                        "message") from None


async def _request_stream(call: ServerCall, request_type: Any) -> AsyncIterator[Any]:
    while (message := await call.read()) is not None:
        yield _parse(request_type, message)
    if call.assembling:  # the messages before it are answered, then this status
        raise AbortCall(GrpcStatus.INVALID_ARGUMENT, _TRUNCATED)


def _deadline_ns(call: ServerCall) -> int | None:
    """grpc-timeout ("100m", "5S", ...) as a perf_counter deadline; None when absent. As the
    gRPC spec says, anything but 1 to 8 ASCII digits and a unit is refused (INVALID_ARGUMENT:
    grpc-go's INTERNAL is kept here for the server's own faults); int() took '-5', '+5', ' 5'
    and hundreds of digits, whose deadline overflowed later."""
    timeout = call.header("grpc-timeout")
    if timeout is None:
        return None
    amount, unit = timeout[:-1], timeout[-1:]
    if not (0 < len(amount) <= 8 and amount.isdigit() and amount.isascii()) or (
            unit not in _TIMEOUT_UNITS_NS):
        raise AbortCall(GrpcStatus.INVALID_ARGUMENT,
                        f"malformed grpc-timeout {timeout[:20]!r}")
    return call.received_ns + int(amount) * _TIMEOUT_UNITS_NS[unit]
