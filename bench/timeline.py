"""A closed-loop HTTP/1.1 load that runs in a background thread while the caller acts (kills a
node, publishes a version), and records every answer by the second it completed, the node that
answered (`serval-node` header) and the model version in its body.

Unlike serval.loadtest.closed_loop (each client walks the request list from its own offset), the
clients here share one cursor: the list is consumed once, in order, so a Zipf-drawn list is an
i.i.d. Zipf stream whatever the concurrency, and `sent` says which requests went out.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import cast

import httptools

CONNECT_TIMEOUT_S = 5.0
_VERSION = re.compile(rb'"model_version"\s*:\s*"([^"]*)"')
_MODEL = re.compile(rb'"model_name"\s*:\s*"([^"]*)"')


class TimelineLoad:
    """`clients` keep-alive connections to host:port, each sending the next request of the shared
    list as soon as its previous answer is complete; start() .. stop()."""

    def __init__(self, host: str, port: int, requests: list[bytes], clients: int,
                 versions: bool = False, timeout_s: float = 30.0) -> None:
        self.host, self.port, self.requests, self.clients = host, port, requests, clients
        self.versions, self.timeout_s = versions, timeout_s
        self.t0 = 0.0
        self.sent = 0  # requests written (the cursor into `requests`)
        # (second, node, version) -> answers; version: "model:version" when `versions`
        self.ok: Counter[tuple[int, str, str]] = Counter()
        self.errors: Counter[tuple[int, str]] = Counter()  # (second, kind) -> count
        self.latencies_ns: list[int] = []
        self.first_seen: dict[tuple[str, str], float] = {}  # (node, version) -> s since t0
        self.last_seen: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._conns: set[_Connection] = set()
        self._thread = threading.Thread(target=self._run, daemon=True)

    # control ------------------------------------------------------------------------------

    def start(self) -> TimelineLoad:
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 10)

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    # results ------------------------------------------------------------------------------

    def per_second(self, first: int, last: int) -> Iterator[tuple[int, int, Counter[str], int]]:
        """(second, answers, answers by node, errors) for each whole second in [first, last)."""
        for second in range(first, last):
            nodes: Counter[str] = Counter()
            for (s, node, _), count in self.ok.items():
                if s == second:
                    nodes[node] += count
            errors = sum(c for (s, _), c in self.errors.items() if s == second)
            yield second, sum(nodes.values()), nodes, errors

    def answers(self, first: float = 0.0, last: float = float("inf")) -> int:
        return sum(c for (s, _, _), c in self.ok.items() if first <= s < last)

    def error_kinds(self) -> Counter[str]:
        kinds: Counter[str] = Counter()
        for (_, kind), count in self.errors.items():
            kinds[kind] += count
        return kinds

    # the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        loop: asyncio.AbstractEventLoop
        try:
            import uvloop
            loop = uvloop.new_event_loop()
        except ImportError:
            loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        tasks = [asyncio.create_task(self._client()) for _ in range(self.clients)]
        watchdog = asyncio.create_task(self._watchdog())
        while not self._stop.is_set():
            await asyncio.sleep(0.05)
        await asyncio.wait(tasks, timeout=self.timeout_s)
        watchdog.cancel()
        for task in tasks:
            task.cancel()

    async def _client(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            try:
                _, conn = await asyncio.wait_for(
                    loop.create_connection(lambda: _Connection(self), self.host, self.port),
                    CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                self._error("connection")
                await asyncio.sleep(0.05)
                continue
            self._conns.add(conn)
            conn.send_next()
            await conn.closed
            self._conns.discard(conn)

    async def _watchdog(self) -> None:
        timeout_ns = int(self.timeout_s * 1e9)
        while True:
            await asyncio.sleep(1.0)
            now = time.perf_counter_ns()
            for conn in list(self._conns):
                if conn.sent_ns and now - conn.sent_ns > timeout_ns:
                    self._error("timeout")
                    conn.sent_ns = 0
                    conn.close()

    def _error(self, kind: str) -> None:
        self.errors[(int(self.now_s()), kind)] += 1

    def _record(self, conn: _Connection, status: int) -> None:
        now_ns = time.perf_counter_ns()
        if not 200 <= status < 300:
            self._error(f"http_{status}")
            return
        self.latencies_ns.append(now_ns - conn.sent_ns)
        at = self.now_s()
        node = conn.node.decode("latin-1") or "?"
        version = ""
        if self.versions:
            body = b"".join(conn.body)
            model, found = _MODEL.search(body), _VERSION.search(body)
            version = (f"{model.group(1).decode() if model else '?'}:"
                       f"{found.group(1).decode() if found else '?'}")
        self.ok[(int(at), node, version)] += 1
        key = (node, version)
        self.first_seen.setdefault(key, at)
        self.last_seen[key] = at


class _Connection(asyncio.Protocol):
    def __init__(self, load: TimelineLoad) -> None:
        self.load = load
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.node = b""
        self.body: list[bytes] = []
        self.sent_ns = 0
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def send_next(self) -> None:
        load = self.load
        if load._stop.is_set() or self.transport is None or self.transport.is_closing():
            self.close()
            return
        request = load.requests[load.sent % len(load.requests)]
        load.sent += 1
        self.node, self.body = b"", []
        self.sent_ns = time.perf_counter_ns()
        self.transport.write(request)

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"serval-node":
            self.node = value

    def on_body(self, body: bytes) -> None:
        if self.load.versions:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.load._record(self, self.parser.get_status_code())
        self.sent_ns = 0
        if self.parser.should_keep_alive():
            self.send_next()
        else:
            self.close()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.load._error("bad_response")
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        elif not self.closed.done():
            self.closed.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.sent_ns:  # a request in flight got no answer
            self.load._error("connection")
            self.sent_ns = 0
        if not self.closed.done():
            self.closed.set_result(None)
