"""Triton's generate extension over HTTP: `POST /v2/models/M[/versions/V]/generate` answers
one JSON object, `generate_stream` answers Server-Sent Events (`data: {...}`), one per response
of a decoupled model as it sends it (a model that is not decoupled: one event). The body's
fields become inputs and parameters (protocol/generate.py); the request then takes the infer
path (admission, batching, statistics, traces). An error before the first response is an
ordinary JSON error with its status; a later one is an event `{"error": ...}`, as in Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from typing import Any

import orjson

from serval.backends.base import ModelMetadata
from serval.dataplane import DataPlane, require_metadata
from serval.errors import DeadlineExceeded, ServalError, UnsupportedCall
from serval.protocol.generate import generate_request, generate_response
from serval.protocol.rest_codec import json_object
from serval.protocol.types import InferRequest
from serval.server.http.errors import JSON_HEADERS, Reply
from serval.server.http.streamed import StreamedReply
from serval.server.streams import infer_stream

ACTIONS = ("generate", "generate_stream")
_EVENT_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
                  (b"cache-control", b"no-cache")]


async def generate(dataplane: DataPlane, name: str, version: str | None, body: bytes,
                   stream: bool, received_ns: int, deadline_ns: int | None = None
                   ) -> Reply | StreamedReply:
    """`deadline_ns` (Serval-Timeout-Ms): a request still queued then is dropped (504), and a
    stream still running then ends with an error event, its request cancelled in the model."""
    dataplane.admit(name, version, deadline_ns)  # 404 and 429 before the body is decoded
    doc = json_object(body, "generate request", "a JSON object of input fields")
    async with dataplane.registry.acquire(name, version) as served:
        metadata = require_metadata(served)
    batching = metadata.max_batch_size > 0
    request = generate_request(doc, metadata.inputs, batching)
    if metadata.decoupled:
        if not stream:
            raise UnsupportedCall(f"model '{name}' is decoupled (0..n responses per request): "
                                  "use generate_stream")
        events = _decoupled(dataplane, name, version, request, received_ns, deadline_ns,
                            metadata)
    else:
        response = await dataplane.infer(name, version, request, received_ns, deadline_ns)
        answer = generate_response(response, batching)
        if not stream:
            return 200, orjson.dumps(answer), list(JSON_HEADERS)
        events = _one(answer)
    try:  # the first response decides the status: a failure before it is a plain error
        first = await anext(events)
    except StopAsyncIteration:  # a decoupled model may answer nothing but its final flag
        first = b""
    except BaseException:
        await events.aclose()
        raise
    return StreamedReply(200, list(_EVENT_HEADERS), first, events)


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


async def _one(doc: dict[str, Any]) -> AsyncGenerator[bytes, None]:
    yield _event(doc)


async def _decoupled(dataplane: DataPlane, name: str, version: str | None,
                     request: InferRequest, received_ns: int, deadline_ns: int | None,
                     metadata: ModelMetadata) -> AsyncGenerator[bytes, None]:
    batching = metadata.max_batch_size > 0
    started = False
    responses = infer_stream(dataplane, name, version, request, received_ns, deadline_ns)
    try:
        async with contextlib.aclosing(responses):
            while True:
                left_s = None if deadline_ns is None else max(
                    0.0, (deadline_ns - time.perf_counter_ns()) / 1e9)
                try:  # past the deadline the wait is cancelled, and so is the request
                    item = await asyncio.wait_for(anext(responses), left_s)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise DeadlineExceeded("the request's deadline (Serval-Timeout-Ms) passed "
                                           "while the model was still answering; the request "
                                           "is cancelled") from None
                started = True
                if item.error is not None:
                    yield _event({"error": item.error.message})
                elif not item.bare:
                    yield _event(generate_response(item.response, batching))
    except ServalError as exc:
        if not started:
            raise  # nothing sent yet: the answer is this error, with its status
        yield _event({"error": exc.message})
