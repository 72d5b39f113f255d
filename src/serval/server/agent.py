"""HAProxy's agent check (`agent-check`, `agent-port`, `agent-send "weight\\n"`): a plain TCP
listener that answers each connection with one line of the node's state and closes it.

    drain\\n              stop_server has begun: the proxy sends no new sessions
    down#not ready\\n     the data plane is not ready (starting, or stopping)
    up ready\\n           serving; `up ready 75%\\n` when the request line says `weight`

The weight is the node's free capacity (requests in flight against --max-inflight, resident
model bytes against --memory-budget, request bytes the transports hold against
--receive-budget-mb: past it every new request gets a 429), in steps of 25 and never below 25:
0 would mean drain, and small swings must not move models around the proxy's consistent-hash
ring.

Policy is the pure functions `capacity_weight` and `agent_reply`; `AgentServer` is the thin
shell. It is bounded like the rest of the server: at most MAX_CONNECTIONS open at once (beyond,
closed unanswered), one line of at most MAX_REQUEST_BYTES read, for at most READ_TIMEOUT_S (the
proxy may send nothing), and no failure escapes a connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import cast

from serval.dataplane import DataPlane
from serval.server.limits import ReceiveBudget

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
MAX_REQUEST_BYTES = 64
READ_TIMEOUT_S = 0.2
WEIGHT_STEP = 25  # percent
WEIGHT_WORD = b"weight"

DRAIN = b"drain\n"
NOT_READY = b"down#not ready\n"
UP = b"up ready\n"
_UP_WEIGHTED = {weight: b"up ready %d%%\n" % weight
                for weight in range(WEIGHT_STEP, 101, WEIGHT_STEP)}


def capacity_weight(inflight: int, max_inflight: int, resident_bytes: int,
                    budget_bytes: int | None, received_bytes: int = 0,
                    receive_budget_bytes: int = 0) -> int:
    """The free share of the tightest of queue, memory and received bytes, in percent, rounded
    to the nearest WEIGHT_STEP, at least WEIGHT_STEP and at most 100. No budget: that one is
    all free."""
    queue_free = 1.0 - inflight / max_inflight if max_inflight > 0 else 0.0
    memory_free = 1.0 if not budget_bytes else 1.0 - resident_bytes / budget_bytes
    receive_free = (1.0 if receive_budget_bytes <= 0
                    else 1.0 - received_bytes / receive_budget_bytes)
    free = min(1.0, max(0.0, min(queue_free, memory_free, receive_free)))
    steps = 100 // WEIGHT_STEP
    return max(WEIGHT_STEP, min(100, int(free * steps + 0.5) * WEIGHT_STEP))


def wants_weight(request: bytes) -> bool:
    """The proxy's `agent-send` line asks for a weight when one of its words is `weight`."""
    return WEIGHT_WORD in request.lower().split()


def agent_reply(draining: bool, ready: bool, weight: int | None) -> bytes:
    """The line for a node's state; `weight` (percent) only when asked for and up."""
    if draining:
        return DRAIN
    if not ready:
        return NOT_READY
    if weight is None:
        return UP
    return _UP_WEIGHTED.get(weight) or b"up ready %d%%\n" % weight


class NodeState:
    """What the agent reports: the data plane's readiness and load (no data plane yet: the
    models are loading, not ready), the transports' receive budget, and whether the node is
    draining (set by stop_server, before anything closes)."""

    def __init__(self, dataplane: DataPlane | None = None,
                 receive_budget: ReceiveBudget | None = None) -> None:
        self.dataplane = dataplane
        self.receive_budget = receive_budget
        self.draining = False

    def reply(self, request: bytes) -> bytes:
        dataplane = self.dataplane
        ready = dataplane is not None and dataplane.ready()
        weight = None
        if ready and not self.draining and wants_weight(request):
            assert dataplane is not None
            registry, received = dataplane.registry, self.receive_budget
            weight = capacity_weight(dataplane.inflight, dataplane.max_inflight,
                                     registry.resident_bytes, registry.memory_budget_bytes,
                                     received.held_bytes if received else 0,
                                     received.limit_bytes if received else 0)
        return agent_reply(self.draining, ready, weight)


class _AgentConnection(asyncio.Protocol):
    """One check: read a line (or wait READ_TIMEOUT_S for none), answer, close."""

    def __init__(self, server: AgentServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.received = b""
        self.counted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        if self.server.open >= self.server.max_connections:
            self.transport.abort()  # past the bound: no answer, no state kept
            return
        self.server.open += 1
        self.counted = True
        self.timer = asyncio.get_running_loop().call_later(
            self.server.read_timeout_s, self._answer)

    def data_received(self, data: bytes) -> None:
        self.received += data[:MAX_REQUEST_BYTES + 1 - len(self.received)]
        if b"\n" in self.received or len(self.received) > MAX_REQUEST_BYTES:
            self._answer()

    def eof_received(self) -> bool:
        self._answer()
        return True  # keep the socket open for the answer; _answer closes it

    def connection_lost(self, exc: Exception | None) -> None:
        if self.counted:
            self.server.open -= 1
            self.counted = False
        if self.timer is not None:
            self.timer.cancel()
        self.transport = self.timer = None

    def _answer(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        line = self.received.partition(b"\n")[0][:MAX_REQUEST_BYTES]
        try:
            reply = self.server.reply(line)
        except Exception:  # a bug must not take the check (or the loop) down: report down
            log.exception("agent check failed")
            reply = b"down#agent error\n"
        try:
            transport.write(reply)
            transport.close()
        except Exception:  # the peer is gone
            transport.abort()


class AgentServer:
    """The agent check listener; `reply(request line) -> answer line` is the policy."""

    def __init__(self, reply: Callable[[bytes], bytes], *,
                 max_connections: int = MAX_CONNECTIONS,
                 read_timeout_s: float = READ_TIMEOUT_S) -> None:
        self.reply = reply
        self.max_connections = max_connections
        self.read_timeout_s = read_timeout_s
        self.open = 0
        self.server: asyncio.Server | None = None

    async def start(self, sock: socket.socket) -> None:
        self.server = await asyncio.get_running_loop().create_server(
            lambda: _AgentConnection(self), sock=sock)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop listening; checks in hand still get their line."""
        if self.server is not None:
            self.server.close()
