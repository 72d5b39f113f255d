"""An HTTP answer whose body is sent in pieces as they are made (the generate extension's
Server-Sent Events): chunked transfer coding, at the pace the client reads."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from serval.server.http.errors import Headers, Reply


@dataclass(slots=True)
class StreamedReply:
    """Status and headers now; the body: `first`, then what `rest` yields. `rest` has been
    started (it made `first`), so whoever takes the reply must close it (contextlib.aclosing):
    closed before its end (the client went away), it stops the work that makes the chunks."""

    status: int
    headers: Headers
    first: bytes
    rest: AsyncGenerator[bytes, None]


async def collected(reply: StreamedReply) -> Reply:
    """The whole body at once, for a caller that cannot stream (the Ray Serve path)."""
    async with contextlib.aclosing(reply.rest) as rest:
        body = reply.first + b"".join([chunk async for chunk in rest])
    return reply.status, body, reply.headers
