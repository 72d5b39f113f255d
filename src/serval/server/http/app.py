"""The v2 REST routes: hand routing from (method, path, headers, body) to the data plane."""

from __future__ import annotations

import asyncio
import base64
import contextvars
import logging
import time
from typing import Any, Protocol

import orjson

from serval.auth import ANONYMOUS, Action, Token, TokenStore, act_as, bearer
from serval.config import TransportLimits
from serval.dataplane import DataPlane
from serval.errors import InvalidInput, ServalError, shown
from serval.observability.metrics import Exposition
from serval.observability.scrapes import PacedRenderer
from serval.protocol.deadlines import deadline_after, may_set_timeout
from serval.protocol.rest_codec import json_object
from serval.server.http.codec_process import CodecProcess
from serval.server.http.errors import (
    JSON_HEADERS,
    Reply,
    error_body,
    method_not_allowed,
    serval_error_response,
    unexpected_error_response,
)
from serval.server.http.generate_routes import ACTIONS as GENERATE
from serval.server.http.generate_routes import generate
from serval.server.http.infer_headers import RawHeaders, decompress, infer_headers
from serval.server.http.openapi import openapi_document
from serval.server.http.shm_routes import is_shared_memory_path, shared_memory_route
from serval.server.http.streamed import StreamedReply
from serval.server.http.ui.routes import StatusRoutes
from serval.server.http.ui.status import ServerStatus
from serval.server.statistics import statistics_chunks, statistics_json

log = logging.getLogger(__name__)


_MODEL_ACTIONS = ("", "ready", "config", "stats", "infer", *GENERATE)


_SERVER_PATHS: tuple[list[str], ...] = (  # the GET routes of _server_route
    [], ["health", "live"], ["health", "ready"], ["models", "stats"], ["openapi.json"])

class Routes(Protocol):
    """What a connection asks of the app behind its port (HttpApp; metrics_port's)."""

    async def handle(self, method: str, path: str, headers: RawHeaders, body: bytes,
                     query: str = "", authorized: Token | None = None
                     ) -> Reply | StreamedReply: ...

    def precheck(self, method: str, path: str, headers: RawHeaders) -> Reply | Token: ...


class HttpApp:
    """Routes v2 REST requests to the data plane and encodes the replies."""

    def __init__(self, dataplane: DataPlane, metrics: Exposition,
                 auth: TokenStore | None = None, status: ServerStatus | None = None,
                 max_body_bytes: int = TransportLimits.max_request_bytes) -> None:
        self.dataplane = dataplane
        self.max_body_bytes = max_body_bytes  # decompressed bodies too
        self.metrics = metrics
        self.scrapes = PacedRenderer(metrics.render)  # floods take <= 10%
        self.auth = auth  # None: no authentication
        self.status = StatusRoutes(status or ServerStatus(dataplane.registry))
        self.codec = CodecProcess()  # large JSON tensors, off the event loop

    def close(self) -> None:
        self.codec.close()

    async def handle(self, method: str, path: str, headers: RawHeaders, body: bytes,
                     query: str = "", authorized: Token | None = None
                     ) -> Reply | StreamedReply:
        """One complete request in, (status, body, headers) out; never raises. `authorized`:
        the caller `precheck` found for these headers, named as this task's caller (whose
        shared-memory regions the request reaches: auth.current_token) without hashing the
        token again; None: checked here."""
        parts = path.strip("/").split("/")
        try:
            if self.auth is not None:
                act_as(authorized if authorized is not None else
                       self._authorize(headers, parts, method))
            return await self._route(method, path, parts, headers, body, query)
        except ServalError as exc:
            return serval_error_response(exc, f"{method} {path}")
        except Exception as exc:
            return unexpected_error_response(exc, f"{method} {path}")

    def precheck(self, method: str, path: str, headers: RawHeaders) -> Reply | Token:
        """Before a body is read: the authorization `handle` would check (401/403), or the
        caller it found (ANONYMOUS without auth, or where the route needs no token).

        The transport asks this when a request's headers are complete, so a client without
        the right token is refused before it can make the server hold its body."""
        if self.auth is None:
            return ANONYMOUS
        try:  # in a context of its own: the token it finds names no later request's caller
            return contextvars.copy_context().run(self._authorize, headers,
                                                  path.strip("/").split("/"), method)
        except ServalError as exc:
            return serval_error_response(exc, f"{method} {path}")

    async def _route(self, method: str, path: str, parts: list[str], headers: RawHeaders,
                     body: bytes, query: str) -> Reply | StreamedReply:
        if parts[0] == "v2":
            settings = _settings_path(parts) if parts[-1] in ("logging", "setting") else None
            if settings is not None:
                return self._settings_route(method, *settings, body)
            if len(parts) >= 3 and parts[1] == "models" and parts[2] != "stats":
                return await self._model_route(method, parts[2:], headers, body)
            if len(parts) >= 3 and parts[1] == "repository":
                return await self._repository_route(method, parts[2:], body)
            if is_shared_memory_path(parts[1:]):
                return shared_memory_route(self.dataplane.shared_memory, method, parts[1:], body)
            return await self._server_route(method, parts[1:])
        if parts == ["metrics"] and method == "GET":
            return 200, await self.scrapes.get(), [(b"content-type", b"text/plain")]
        if StatusRoutes.is_asset(parts):  # the status page: open, it holds no data
            return self.status.asset(method, parts)
        if parts[0] == "status":  # the status page's JSON: over every model
            async with self.dataplane.loop_share.turn():
                return self.status.json(method, parts[1:], query)
        return _not_found(method, path)

    def _authorize(self, headers: RawHeaders, parts: list[str], method: str) -> Token:
        """The caller (401/403 when its token may not): ANONYMOUS where none is needed."""
        if self.auth is not None:
            needed = _access(method, parts)
            if needed is not None:
                return self.auth.check(bearer(_authorization(headers)), *needed)
        return ANONYMOUS

    async def _server_route(self, method: str, parts: list[str]) -> Reply | StreamedReply:
        if method != "GET":
            if parts not in _SERVER_PATHS:  # no such route (e.g. an extension not served)
                return _not_found(method, "/v2/" + "/".join(parts))
            return method_not_allowed(method, "/v2/" + "/".join(parts), "GET")
        if parts == []:
            return _json(self.dataplane.server_metadata())
        if parts == ["health", "live"]:
            return _status_only(200 if self.dataplane.live() else 503)
        if parts == ["health", "ready"]:
            reason = self.dataplane.not_ready_reason()
            return (503, error_body(reason), list(JSON_HEADERS)) if reason else _status_only(200)
        if parts == ["models", "stats"]:  # every model's: sent as made, at the client's pace
            chunks = statistics_chunks(self.dataplane)
            return StreamedReply(200, list(JSON_HEADERS), await anext(chunks), chunks)
        if parts == ["openapi.json"]:
            return _json(openapi_document())
        return _not_found(method, "/v2/" + "/".join(parts))

    def _settings_route(self, method: str, kind: str, model: str | None, body: bytes) -> Reply:
        """Triton's logging (/v2/logging) and trace (/v2[/models/M]/trace/setting) extensions:
        GET reads the settings, POST changes those it names and answers them all."""
        if method not in ("GET", "POST"):
            return method_not_allowed(method, f"{kind} settings (use GET or POST)",
                                      "GET, POST")
        changes = None
        if method == "POST":
            changes = json_object(body, f"{kind} settings", "a JSON object") if body.strip() \
                else {}
        if kind == "log":
            return _json(self.dataplane.log_settings(changes))
        return _json(self.dataplane.trace_settings(model, changes))

    async def _model_route(
        self, method: str, parts: list[str], headers: RawHeaders, body: bytes
    ) -> Reply | StreamedReply:
        name, version, action = _split_model_path(parts)
        if action is None:
            return _not_found(method, "/v2/models/" + "/".join(parts))
        if action == "infer" or action in GENERATE:
            if method != "POST":
                return method_not_allowed(method, f"{action} (use POST)", "POST")
            if action != "infer":  # Triton's generate extension
                received_ns = time.perf_counter_ns()
                _, encoding, timeout_ms = infer_headers(headers)
                return await generate(
                    self.dataplane, name, version,
                    decompress(body, encoding, self.max_body_bytes),
                    action == "generate_stream", received_ns,
                    deadline_after(received_ns, timeout_ms))
            return await self._infer(name, version, headers, body)
        if method != "GET":
            return method_not_allowed(method, f"/v2/models/{name} {action}".rstrip(), "GET")
        if action == "ready":
            ready = self.dataplane.model_ready(name, version)  # not ready: 400, as Triton
            return _json({"name": name, "ready": ready}, 200 if ready else 400)
        if action == "config":
            return _json(await self.dataplane.model_config(name, version))
        if action == "stats":
            return 200, statistics_json(self.dataplane, name, version), list(JSON_HEADERS)
        return _json(await self.dataplane.model_metadata(name, version))

    async def _repository_route(self, method: str, parts: list[str], body: bytes) -> Reply:
        """Triton's model repository extension: index, load (optional config), unload."""
        if method != "POST":
            return method_not_allowed(method, "/v2/repository (use POST)", "POST")
        params = _repository_parameters(body)
        if parts == ["index"]:
            ready = params.get("ready", False)
            if not isinstance(ready, bool):
                raise InvalidInput("repository index 'ready' must be a JSON boolean (true or "
                                   f"false), got {shown(ready)}")
            async with self.dataplane.loop_share.turn():
                return _json(self.dataplane.repository_index(ready))
        if len(parts) == 3 and parts[0] == "models" and parts[2] in ("load", "unload"):
            if parts[2] == "load":
                await self.dataplane.load_model(parts[1], params.get("config"),
                                                _file_parameters(parts[1], params))
            else:
                dependents = params.get("unload_dependents", False)
                if not isinstance(dependents, bool):
                    raise InvalidInput("parameter 'unload_dependents' must be a JSON boolean "
                                       f"(true or false), got {shown(dependents)}")
                await self.dataplane.unload_model(parts[1], dependents)
            return _status_only(200)
        return _not_found(method, "/v2/repository/" + "/".join(parts))

    async def _infer(
        self, name: str, version: str | None, headers: RawHeaders, body: bytes
    ) -> Reply:
        received_ns = time.perf_counter_ns()
        header_length, encoding, timeout_ms = infer_headers(headers)
        deadline_ns = deadline_after(received_ns, timeout_ms)
        own_timeout = (deadline_ns is None and self.dataplane.default_timeout_ns > 0
                       and may_set_timeout(body, header_length, encoding))  # else moot
        self.dataplane.admit(name, version, deadline_ns, own_timeout)
        if encoding not in (b"", b"identity"):  # 64 KiB may inflate to 64 MiB: zlib lets go
            # of the GIL, so on a thread inflating leaves the loop to the others
            body = await asyncio.to_thread(decompress, body, encoding, self.max_body_bytes)
        request = await self.codec.decode(body, header_length)
        response = await self.dataplane.infer(name, version, request, received_ns, deadline_ns)
        payload, json_length = await self.codec.encode(response, request)
        if json_length is None:
            return 200, payload, list(JSON_HEADERS)
        return 200, payload, [
            (b"content-type", b"application/octet-stream"),
            (b"inference-header-content-length", str(json_length).encode()),
        ]


def _settings_path(parts: list[str]) -> tuple[str, str | None] | None:
    """("log", None) for /v2/logging, ("trace", model or None) for /v2[/models/M]/trace/setting,
    else None."""
    if parts == ["v2", "logging"]:
        return "log", None
    if parts == ["v2", "trace", "setting"]:
        return "trace", None
    if len(parts) == 5 and parts[1] == "models" and parts[3:] == ["trace", "setting"]:
        return "trace", parts[2]
    return None


def _access(method: str, parts: list[str]) -> tuple[Action, str] | None:
    """The scope a request needs on which model, read from its path as `_route` reads it; None:
    open (health probes, the status page's assets) or refused before authorization (404, 405)."""
    if _settings_path(parts) is not None:  # the server's logs and traces: admin to change
        return (Action.ADMIN if method == "POST" else Action.READ), ""
    if parts[0] == "v2":
        if len(parts) >= 3 and parts[1] == "models" and parts[2] != "stats":
            name, _, action = _split_model_path(parts[2:])
            if action is None:
                return None
            return (Action.INFER if action == "infer" or action in GENERATE
                    else Action.READ), name
        if len(parts) >= 3 and parts[1] == "repository":
            if method != "POST":
                return None
            return (Action.READ if parts[2:] == ["index"] else Action.ADMIN), ""
        if is_shared_memory_path(parts[1:]):
            return Action.SHARED_MEMORY, ""
        return None if parts[1:2] == ["health"] else (Action.READ, "")
    if parts == ["metrics"] and method == "GET":
        return Action.READ, ""
    if parts[0] == "status":
        return Action.READ, ""
    return None


def _split_model_path(parts: list[str]) -> tuple[str, str | None, str | None]:
    """[name, (versions, v,) action?] -> (name, version, action or None if unroutable)."""
    name, rest = parts[0], parts[1:]
    version = None
    if len(rest) >= 2 and rest[0] == "versions":
        version, rest = rest[1], rest[2:]
    if len(rest) > 1:
        return name, version, None
    action = rest[0] if rest else ""
    return name, version, action if action in _MODEL_ACTIONS else None


def _authorization(headers: RawHeaders) -> str | None:
    for key, value in headers:
        if key == b"authorization":
            return value.decode("latin-1")
    return None


def _repository_parameters(body: bytes) -> dict[str, Any]:
    """The request's options: index takes {"ready": bool}, load {"parameters": {"config": ...}}."""
    if not body.strip():
        return {}
    doc = json_object(body, "request body", "a JSON object")
    parameters = doc.get("parameters")
    if parameters is None:
        parameters = {}
    elif not isinstance(parameters, dict):  # [] too: never read as "no parameters"
        raise InvalidInput(f"'parameters' must be a JSON object, got {shown(parameters)}")
    return {**doc, **parameters}


def _file_parameters(name: str, params: dict[str, Any]) -> dict[str, bytes]:
    """load's 'file:<path>' parameters, decoded from base64 as tritonclient sends them."""
    files = {}
    for key, value in params.items():
        if key.startswith("file:"):
            try:
                if not isinstance(value, str):
                    raise ValueError
                files[key] = base64.b64decode(value, validate=True)
            except ValueError:  # binascii.Error too
                raise InvalidInput(f"failed to load '{name}': parameter {key[:80]!r} must be "
                                   "the file's bytes as base64 text") from None
    return files


def _json(doc: Any, status: int = 200) -> Reply:
    return status, orjson.dumps(doc), list(JSON_HEADERS)


def _status_only(status: int) -> Reply:
    return status, b"", [(b"content-type", b"text/plain")]


def _not_found(method: str, path: str) -> Reply:
    return 404, error_body(f"no route for {method} {path}"), list(JSON_HEADERS)


