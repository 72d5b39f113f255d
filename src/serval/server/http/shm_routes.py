"""Triton's shared-memory routes over REST: /v2/systemsharedmemory (status, register,
unregister) and /v2/cudasharedmemory, which this server refuses (it has no CUDA)."""

from __future__ import annotations

from typing import Any

import orjson

from serval.auth import current_token
from serval.errors import InvalidInput
from serval.protocol.rest_codec import json_object
from serval.protocol.shared_memory import SharedMemoryRegistry
from serval.protocol.shm_tensors import CUDA_UNSUPPORTED, DISABLED
from serval.server.http.errors import JSON_HEADERS, Reply, error_body, method_not_allowed

PREFIXES = ("systemsharedmemory", "cudasharedmemory")


def is_shared_memory_path(parts: list[str]) -> bool:
    """Whether /v2/<parts...> is one of the shared-memory routes' paths (parts after 'v2')."""
    return bool(parts) and parts[0] in PREFIXES


def shared_memory_route(regions: SharedMemoryRegistry | None, method: str, parts: list[str],
                        body: bytes) -> Reply:
    """[prefix, ('region', name,) action] -> the action's answer; InvalidInput for bad ones."""
    prefix, rest = parts[0], parts[1:]
    name = ""
    if len(rest) == 3 and rest[0] == "region" and rest[1]:
        name, rest = rest[1], rest[2:]
    action = rest[0] if len(rest) == 1 else ""
    if action not in ("status", "register", "unregister") or (action == "register"
                                                              and not name):
        return _reply(404, error_body(f"no route for {method} /v2/{'/'.join(parts)}"))
    wanted = "GET" if action == "status" else "POST"
    if method != wanted:
        return method_not_allowed(method, f"shared memory {action} (use {wanted})", wanted)
    if prefix == "cudasharedmemory":
        return _cuda(action, name)
    if regions is None:
        raise InvalidInput(DISABLED)
    caller = current_token()  # each client reaches the regions it registered (admin: all)
    if action == "status":
        return _json([region.as_dict() for region in regions.status(name, caller)])
    if action == "register":
        regions.register(name, *_register_body(body), caller=caller)
    else:
        regions.unregister(name, caller)
    return _done()


def _cuda(action: str, name: str) -> Reply:
    """No region is ever registered: status of all is empty and unregister has nothing to do
    (Triton's clients call it before they start); registering, or asking for one, is refused."""
    if action == "register" or (action == "status" and name):
        raise InvalidInput(CUDA_UNSUPPORTED)
    return _json([]) if action == "status" else _done()


def _register_body(body: bytes) -> tuple[str, int, int]:
    doc = json_object(body, "register request body",
                      'a JSON object {"key": ..., "offset": ..., "byte_size": ...}')
    for field in ("key", "byte_size"):
        if field not in doc:
            raise InvalidInput(f"register request body needs '{field}' (and 'offset', 0 if "
                               "left out)")
    key, offset, byte_size = doc["key"], doc.get("offset", 0), doc["byte_size"]
    if not isinstance(key, str):
        raise InvalidInput("register request body: 'key' must be a string such as "
                           "\"/my_region\"")
    return key, offset, byte_size


def _json(doc: Any) -> Reply:
    return _reply(200, orjson.dumps(doc))


def _done() -> Reply:
    return 200, b"", [(b"content-type", b"text/plain")]  # as the app's other empty answers


def _reply(status: int, body: bytes) -> Reply:
    return status, body, list(JSON_HEADERS)
