"""An HTTP answer whose body is sent in pieces as they are made (the generate extension's
Server-Sent Events): chunked transfer coding, at the pace the client reads."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from serval.server.http.errors import Headers, Reply


@dataclass(slots=True)
class StreamedReply:
    """Status and headers now; the body from `chunks`. Closing `chunks` before its end (the
    client went away) stops the work that makes them."""

    status: int
    headers: Headers
    chunks: AsyncGenerator[bytes, None]


async def collected(reply: StreamedReply) -> Reply:
    """The whole body at once, for a caller that cannot stream (the Ray Serve path)."""
    async with contextlib.aclosing(reply.chunks) as chunks:
        body = b"".join([chunk async for chunk in chunks])
    return reply.status, body, reply.headers
