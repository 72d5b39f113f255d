"""One call before a load test: the model's inputs over gRPC (when only a gRPC address is
given), and a first request sent alone (counted in the results as `first_request`), so a test
whose requests the server refuses fails at once with the server's reason instead of measuring
errors. Works against any v2 server."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

import httptools
import orjson

from serval.loadtest.grpc_client import GrpcClientConnection, grpc_message, request_headers
from serval.loadtest.workloads import WorkloadError
from serval.protocol.types import TensorSpec

SERVICE = "/inference.GRPCInferenceService/"
_GRPC_NAMES = {3: "INVALID_ARGUMENT", 5: "NOT_FOUND", 7: "PERMISSION_DENIED", 8:
               "RESOURCE_EXHAUSTED", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
               16: "UNAUTHENTICATED"}
# the request's own fault: every request of the test would be refused the same way
_GRPC_CLIENT_FAULTS = (3, 5, 7, 12, 16)
_MAX_REASON_CHARS = 300
MAX_ANSWER_BYTES = 1024 * 1024  # one probe's answer read at most (a v2 error is far smaller)


class NoAnswer(WorkloadError):
    """No answer within the timeout (a slow server, not a refusal)."""


@dataclass(frozen=True)
class Answer:
    ok: bool
    client_fault: bool  # a 4xx but 408 / 429, or its gRPC kin: the request itself is refused
    status: str  # "HTTP 400", "INVALID_ARGUMENT"
    reason: str  # the server's error text, shortened
    payload: bytes = b""

    def as_dict(self) -> dict[str, object]:
        return {"ok": self.ok, "status": self.status, "reason": self.reason}


def grpc_model_inputs(host: str, port: int, model: str, timeout_s: float) -> list[TensorSpec]:
    """The model's inputs from ModelMetadata; WorkloadError naming the address otherwise."""
    from serval.protocol.grpc import grpc_service_pb2 as pb

    request = pb.ModelMetadataRequest(name=model).SerializeToString()
    answer = grpc_call(host, port, "ModelMetadata", request, timeout_s)
    if not answer.ok:
        raise WorkloadError(f"model {model!r}: ModelMetadata answered {answer.status}: "
                            f"{answer.reason}")
    response = pb.ModelMetadataResponse()
    try:
        response.ParseFromString(answer.payload)
    except Exception:  # protobuf's DecodeError: not a v2 server
        raise WorkloadError(f"gRPC {host}:{port}: ModelMetadata's answer is not a v2 "
                            "ModelMetadataResponse") from None
    specs = [TensorSpec(i.name, i.datatype, tuple(int(d) for d in i.shape))
             for i in response.inputs]
    if not specs:
        raise WorkloadError(f"model {model!r}: metadata lists no inputs")
    return specs


def check_first_request(protocol: str, host: str, port: int, request: bytes,
                        timeout_s: float) -> Answer:
    """Send one prepared request alone, before any step; WorkloadError with the server's
    reason when the request itself is refused (a bad input, an unknown model, a missing
    token: every request would be). Overload and server failures are measured instead."""
    try:
        if protocol == "grpc":
            answer = grpc_call(host, port, "ModelInfer", request, timeout_s)
        else:
            answer = http_call(host, port, request, timeout_s)
    except NoAnswer as exc:
        return Answer(False, False, "timeout", str(exc))
    if answer.client_fault:
        raise WorkloadError(f"the server refused the test's first request ({answer.status}): "
                            f"{answer.reason}; nothing was measured")
    return answer


def http_call(host: str, port: int, request: bytes, timeout_s: float) -> Answer:
    """One complete HTTP/1.1 request (already encoded) and its answer."""
    parts: list[bytes] = []
    done: list[int] = []

    class Sink:
        def on_body(self, body: bytes) -> None:
            parts.append(body)

        def on_message_complete(self) -> None:
            done.append(1)

    parser = httptools.HttpResponseParser(Sink())
    where = f"HTTP {host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(request)
            received = 0
            while not done:
                data = sock.recv(65536)
                if not data:
                    raise WorkloadError(f"{where}: the connection closed before an answer")
                received += len(data)
                if received > MAX_ANSWER_BYTES:
                    raise WorkloadError(f"{where}: the answer to the first request runs past "
                                        f"{MAX_ANSWER_BYTES} bytes (is this a v2 server?)")
                parser.feed_data(data)
    except TimeoutError:
        raise NoAnswer(f"{where}: no answer within {timeout_s:g} s") from None
    except (OSError, httptools.HttpParserError) as exc:
        raise WorkloadError(f"{where}: {exc or type(exc).__name__}") from None
    status = parser.get_status_code()
    body = b"".join(parts)
    ok = 200 <= status < 300
    return Answer(ok, 400 <= status < 500 and status not in (408, 429), f"HTTP {status}",
                  "" if ok else _reason(body), body)


def grpc_call(host: str, port: int, method: str, request: bytes, timeout_s: float) -> Answer:
    """One unary call of the v2 service; WorkloadError when no gRPC answer comes."""
    where = f"gRPC {host}:{port}"
    try:
        return asyncio.run(asyncio.wait_for(_unary(host, port, method, request), timeout_s))
    except TimeoutError:
        raise NoAnswer(f"{where}: no answer to {method} within {timeout_s:g} s") from None
    except OSError as exc:
        raise WorkloadError(f"{where}: {exc} (is this a v2 gRPC port?)") from None


async def _unary(host: str, port: int, method: str, request: bytes) -> Answer:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Answer] = loop.create_future()
    messages: list[bytes] = []

    def on_end(stream_id: int, status: int, message: str) -> None:
        if not done.done():
            name = "OK" if status == 0 else _GRPC_NAMES.get(status, f"status {status}")
            done.set_result(Answer(status == 0 and bool(messages),
                                   status in _GRPC_CLIENT_FAULTS, name,
                                   _reason(message.encode()), messages[0] if messages else b""))

    def on_lost(connection: GrpcClientConnection) -> None:
        if not done.done():
            done.set_exception(ConnectionError("the connection closed before an answer"))

    _, connection = await loop.create_connection(
        lambda: GrpcClientConnection(lambda _s, m: messages.append(m), on_end, on_lost),
        host, port)
    try:
        await connection.ready
        connection.unary(request_headers(SERVICE + method, f"{host}:{port}"),
                         grpc_message(request))
        connection.flush()
        return await done
    finally:
        connection.close()
        if done.done() and not done.cancelled():
            done.exception()  # a loss that `ready` raised already: retrieved, said once


def _reason(body: bytes) -> str:
    """The error text of a v2 answer ({"error": ...} or plain), on one short line."""
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = orjson.loads(body)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
            text = parsed["error"]
    except orjson.JSONDecodeError:
        pass
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON_CHARS else text[:_MAX_REASON_CHARS - 1] + "…"
