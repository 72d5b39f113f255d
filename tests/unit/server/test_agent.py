"""The HAProxy agent check: the weight and reply policy (pure), the node's state over a real
data plane, and the listener on a loopback port (one line in, one line out, bounded)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from serval.backends.base import BackendOptions
from serval.dataplane import DataPlane
from serval.repository.backends import BackendTable
from serval.repository.registry import ModelRegistry
from serval.server.agent import (
    DRAIN,
    MAX_REQUEST_BYTES,
    NOT_READY,
    UP,
    AgentServer,
    NodeState,
    agent_reply,
    capacity_weight,
    wants_weight,
)

pytestmark = pytest.mark.unit

GIB = 1 << 30


@pytest.mark.parametrize(("inflight", "max_inflight", "resident", "budget", "weight"), [
    (0, 100, 0, None, 100),  # idle, no budget
    (10, 100, 0, None, 100),  # 90% free: 100 (small swings do not move the weight)
    (20, 100, 0, None, 75),
    (50, 100, 0, None, 50),
    (70, 100, 0, None, 25),
    (100, 100, 0, None, 25),  # full: the floor, never 0 (0 would mean drain)
    (150, 100, 0, None, 25),  # past the limit (a burst): still the floor
    (0, 100, GIB // 2, GIB, 50),  # memory the tighter one
    (60, 100, GIB // 10, GIB, 50),  # the queue the tighter one
    (0, 100, 2 * GIB, GIB, 25),  # over the budget
    (0, 100, 5 * GIB, 0, 100),  # a zero budget reads as none
])
def test_capacity_weight_is_the_tighter_headroom_in_steps_of_25(
        inflight: int, max_inflight: int, resident: int, budget: int | None,
        weight: int) -> None:
    assert capacity_weight(inflight, max_inflight, resident, budget) == weight


def test_capacity_weight_counts_the_receive_budget_held() -> None:
    assert capacity_weight(0, 64, 0, None, GIB, GIB) == 25  # every new request would be a 429
    assert capacity_weight(0, 64, 0, None, GIB // 2, GIB) == 50
    assert capacity_weight(0, 64, 0, None, 5, 0) == 100  # no budget: all free


def test_capacity_weight_only_ever_takes_four_values() -> None:
    seen = {capacity_weight(n, 64, m * GIB // 8, GIB) for n in range(0, 80) for m in range(10)}
    assert seen == {25, 50, 75, 100}


def test_replies_by_state() -> None:
    assert agent_reply(draining=True, ready=True, weight=75) == DRAIN == b"drain\n"
    assert agent_reply(draining=True, ready=False, weight=None) == DRAIN
    assert agent_reply(draining=False, ready=False, weight=None) == NOT_READY
    assert NOT_READY == b"down#not ready\n"
    assert agent_reply(draining=False, ready=True, weight=None) == UP == b"up ready\n"
    assert agent_reply(draining=False, ready=True, weight=75) == b"up ready 75%\n"


@pytest.mark.parametrize(("line", "wanted"), [
    (b"weight", True), (b"WEIGHT", True), (b" weight \r", True), (b"ready weight", True),
    (b"", False), (b"weights", False), (b"status", False), (b"\xff\x00", False),
])
def test_a_weight_is_given_when_the_line_asks_for_it(line: bytes, wanted: bool) -> None:
    assert wants_weight(line) is wanted


def _dataplane(tmp_path: Path, budget: int | None = None) -> DataPlane:
    registry = ModelRegistry(tmp_path, BackendTable(BackendOptions(1, False)),
                             memory_budget_bytes=budget)
    return DataPlane(registry, max_inflight=8)


def test_node_state_follows_the_data_plane(tmp_path: Path) -> None:
    node = NodeState()
    assert node.reply(b"weight") == NOT_READY  # the models are still loading
    node.dataplane = dataplane = _dataplane(tmp_path, budget=GIB)
    assert node.reply(b"weight") == NOT_READY
    dataplane.set_ready(True)
    assert node.reply(b"") == UP
    assert node.reply(b"weight") == b"up ready 100%\n"  # nothing in flight, nothing resident
    node.draining = True
    assert node.reply(b"weight") == DRAIN


def _ask(port: int, send: bytes | None, *, half_close: bool = False) -> bytes:
    """One check as HAProxy makes it: connect, maybe send, read to the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        if send is not None:
            sock.sendall(send)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(1024):
            chunks.append(chunk)
        return b"".join(chunks)


async def _serving(reply: Callable[[bytes], bytes], **options: float) -> AgentServer:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    agent = AgentServer(reply, **options)  # type: ignore[arg-type]
    await agent.start(sock)
    return agent


def _echo(line: bytes) -> bytes:
    return b"got " + line + b"\n"


def test_the_listener_answers_one_line_and_closes() -> None:
    asyncio.run(_the_listener_answers_one_line_and_closes())


async def _the_listener_answers_one_line_and_closes() -> None:
    agent = await _serving(_echo)
    try:
        ask = asyncio.to_thread
        assert await ask(_ask, agent.port, b"weight\n") == b"got weight\n"
        assert await ask(_ask, agent.port, b"weight\nmore\n") == b"got weight\n"
        assert await ask(_ask, agent.port, b"wei") == b"got wei\n"  # no newline: the timeout
        assert await ask(_ask, agent.port, None) == b"got \n"  # nothing sent: state only
        assert await ask(_ask, agent.port, b"weight", half_close=True) == b"got weight\n"
        long = b"x" * (4 * MAX_REQUEST_BYTES)
        assert await ask(_ask, agent.port, long) == b"got " + long[:MAX_REQUEST_BYTES] + b"\n"
        assert agent.open == 0
    finally:
        agent.close()


def test_a_failing_policy_reports_down_and_the_listener_goes_on() -> None:
    asyncio.run(_a_failing_policy_reports_down_and_the_listener_goes_on())


async def _a_failing_policy_reports_down_and_the_listener_goes_on() -> None:
    def broken(line: bytes) -> bytes:
        raise RuntimeError("bug")

    agent = await _serving(broken)
    try:
        assert await asyncio.to_thread(_ask, agent.port, b"weight\n") == b"down#agent error\n"
        assert await asyncio.to_thread(_ask, agent.port, b"\n") == b"down#agent error\n"
    finally:
        agent.close()


def test_connections_past_the_bound_are_closed_unanswered() -> None:
    asyncio.run(_connections_past_the_bound_are_closed_unanswered())


async def _connections_past_the_bound_are_closed_unanswered() -> None:
    agent = await _serving(_echo, max_connections=1, read_timeout_s=30.0)
    try:
        holder = await asyncio.to_thread(socket.create_connection, ("127.0.0.1", agent.port))
        try:
            while agent.open < 1:  # the listener has taken the first connection
                await asyncio.sleep(0.005)
            try:
                refused = await asyncio.to_thread(_ask, agent.port, b"weight\n")
            except ConnectionResetError:  # closed with the request unread: a reset
                refused = b""
            assert refused == b""
            holder.sendall(b"weight\n")
            assert await asyncio.to_thread(holder.recv, 64) == b"got weight\n"
        finally:
            holder.close()
        while agent.open:
            await asyncio.sleep(0.005)
        assert await asyncio.to_thread(_ask, agent.port, b"weight\n") == b"got weight\n"
    finally:
        agent.close()
