"""The load generators' HTTP/1.1 client connection on a real loopback socket, and its tally."""

from __future__ import annotations

import asyncio

import pytest

from serval.loadtest.http_client import HttpClientConnection, Tally, encode_http_request

pytestmark = pytest.mark.unit

MS = 1_000_000
REQUEST = encode_http_request("POST", "/v2/models/m/infer", b"{}", {"X-Test": "1"}, host="h")


def test_a_request_is_complete_keep_alive_http11() -> None:
    head, body = REQUEST.split(b"\r\n\r\n")
    assert head.split(b"\r\n") == [b"POST /v2/models/m/infer HTTP/1.1", b"Host: h",
                                   b"Connection: keep-alive", b"Content-Length: 2",
                                   b"X-Test: 1"]
    assert body == b"{}"


def test_the_tally_counts_answers_by_their_share_of_the_window() -> None:
    tally = Tally((REQUEST,))
    tally.start(0, warmup_s=0.01, duration_s=0.1)  # window [10 ms, 110 ms)
    tally.record(200, 20 * MS, 30 * MS)  # inside
    tally.record(200, 0, 20 * MS)  # half in the warm-up: no latency, half served
    tally.record(200, 100 * MS, 120 * MS)  # crosses the end: latency kept, half served
    tally.record(503, 50 * MS, 60 * MS)
    assert list(tally.latencies) == [10 * MS, 20 * MS]
    assert tally.served == pytest.approx(2.0)
    assert tally.answered == 3
    assert tally.errors == {"http_503": 1}


class _Owner:
    """Records what its connection reports; resolves `done` at the first answer."""

    def __init__(self) -> None:
        self.made: list[HttpClientConnection] = []
        self.statuses: list[int] = []
        self.lost_count = 0
        self.answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def opened(self, conn: HttpClientConnection) -> None:
        self.made.append(conn)

    def answered(self, conn: HttpClientConnection, status: int) -> None:
        self.statuses.append(status)
        if not self.answer.done():
            self.answer.set_result(status)

    def lost(self, conn: HttpClientConnection) -> None:
        self.lost_count += 1


async def _exchange(reply: bytes, **options: bool) -> tuple[HttpClientConnection, _Owner, Tally]:
    """Send REQUEST to a loopback server that answers `reply`, then wait for the end."""
    received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.set_result(await reader.readexactly(len(REQUEST)))
        writer.write(reply)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    tally, owner = Tally((REQUEST,)), _Owner()
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(
        lambda: HttpClientConnection(tally, owner, **options), "127.0.0.1", port)
    assert owner.made == [conn]
    conn.send(0, 1)
    assert await asyncio.wait_for(received, 5) == REQUEST
    await asyncio.wait_for(conn.closed, 5)
    server.close()
    await server.wait_closed()
    return conn, owner, tally


def test_an_answer_is_tallied_then_handed_to_the_owner() -> None:
    async def main() -> None:
        reply = (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Length: 5\r\n"
                 b"\r\nbusy!")
        conn, owner, tally = await _exchange(reply, sample=True, retry_after=True)
        assert owner.statuses == [429] and owner.lost_count == 1
        assert conn.retry_after == b"2" and conn.origin_ns == 0
        assert (tally.sample_status, tally.sample) == (429, b"busy!")
        assert tally.errors == {"http_429": 1}

    asyncio.run(main())


def test_without_asking_neither_body_nor_retry_after_is_kept() -> None:
    async def main() -> None:
        reply = b"HTTP/1.1 200 OK\r\nRetry-After: 2\r\nContent-Length: 2\r\n\r\n{}"
        conn, owner, tally = await _exchange(reply)
        assert owner.statuses == [200] and tally.answered == 1
        assert conn.retry_after == b"" and tally.sample == b"" and tally.sample_status == 0

    asyncio.run(main())


def test_an_answer_that_is_not_http_is_a_bad_response() -> None:
    async def main() -> None:
        conn, owner, tally = await _exchange(b"SSH-2.0-OpenSSH\r\n\r\n")
        assert owner.statuses == [] and owner.lost_count == 1
        assert tally.errors == {"bad_response": 1} and conn.closing

    asyncio.run(main())
