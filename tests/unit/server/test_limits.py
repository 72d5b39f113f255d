"""The transports' shared guards: the connection gate at its limit, and as an operator sees
them, the abuse log's counts and lines and the Prometheus series built from them."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import generate_latest

from serval.config import TransportLimits
from serval.observability.metrics import TransportMetricsCollector, build_registry
from serval.server.build import transport_gauges
from serval.server.limits import AbuseLog, ConnectionGate, SendBacklog, TransportGuards

pytestmark = pytest.mark.unit


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_every_close_is_counted_but_a_kind_is_logged_once_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    abuse = AbuseLog(interval_s=10.0, clock=clock)
    assert set(abuse.counts) == set(AbuseLog.KINDS) and not any(abuse.counts.values())
    with caplog.at_level(logging.WARNING, logger="serval.server.limits"):
        for _ in range(1000):
            abuse.closed("write stall", "a client read nothing")
        abuse.closed("header timeout", "slow headers")  # another kind has its own interval
        clock.now = 10.0
        abuse.closed("write stall", "a client read nothing")
    assert abuse.counts["write stall"] == 1001 and abuse.counts["header timeout"] == 1
    assert [record.getMessage() for record in caplog.records] == [
        "closed a connection: a client read nothing (write stall: 1 so far)",
        "closed a connection: slow headers (header timeout: 1 so far)",
        "closed a connection: a client read nothing (write stall: 1001 so far)",
    ]


def test_the_guards_series_exist_from_the_start_and_follow_the_counts() -> None:
    guards = TransportGuards.build(TransportLimits(max_connections=100))
    text = generate_latest(build_registry(
        TransportMetricsCollector(lambda: transport_gauges(guards)))).decode()
    assert "serval_connections_limit 100.0" in text
    for kind in AbuseLog.KINDS:  # rate() works before the first close of a kind
        assert f'serval_connections_closed_total{{reason="{kind}"}} 0.0' in text
    guards.abuse.closed("http2 flood", "a PING flood")
    assert guards.budget.reserve(1000) and not guards.budget.reserve(guards.budget.limit_bytes)
    text = generate_latest(build_registry(
        TransportMetricsCollector(lambda: transport_gauges(guards)))).decode()
    assert 'serval_connections_closed_total{reason="http2 flood"} 1.0' in text
    assert "serval_receive_budget_held_bytes 1000.0" in text
    assert "serval_receive_budget_refusals_total 1.0" in text


class _Connection:
    def __init__(self, idle: bool = False) -> None:
        self.idle, self.asked, self.evicted = idle, 0, False

    def is_idle(self) -> bool:
        self.asked += 1
        return self.idle

    def evict(self) -> None:
        self.evicted = True

    def abort(self) -> None:
        self.evicted = True


def test_at_the_limit_the_oldest_idle_connection_makes_room() -> None:
    gate = ConnectionGate(3, AbuseLog())
    busy, idle, newer_idle = _Connection(), _Connection(idle=True), _Connection(idle=True)
    for connection in (busy, idle, newer_idle):
        assert gate.admit(connection)
    arriving = _Connection()
    assert gate.admit(arriving)
    assert idle.evicted and not newer_idle.evicted and not busy.evicted
    assert list(gate.fresh) == [busy, newer_idle, arriving] and gate.count == 3


def test_at_the_limit_connections_that_served_requests_go_last() -> None:
    """A client's keep-alive connection, opened first and idle between two calls, was the
    oldest idle one: a flood of slowloris opens at the limit closed it before any of theirs
    (a CI run saw a gRPC client's call fail so). Opens that never finished a request now go
    first, oldest first; then the served connection idle longest."""
    gate = ConnectionGate(4, AbuseLog())
    client, other, slow, slower = (_Connection(idle=True) for _ in range(4))
    for connection in (client, other, slow, slower):
        assert gate.admit(connection)
    gate.touch(client)  # each finished a call
    gate.touch(other)
    assert gate.admit(_Connection()) and gate.admit(_Connection(idle=True))
    assert slow.evicted and slower.evicted and not client.evicted and not other.evicted
    gate.touch(client)  # another call: now other is idle longest
    for connection in list(gate.fresh):
        connection.idle = False
    assert gate.admit(_Connection())
    assert other.evicted and not client.evicted
    gate.release(client)
    gate.touch(client)  # closed meanwhile: nothing to move
    assert gate.count == 3 and client not in gate.served and client not in gate.fresh


def test_while_every_connection_is_busy_a_flood_of_new_ones_is_not_a_scan_each() -> None:
    """Each refused connection scanned every open one for an idle one to close: 10,000 busy
    connections made each refusal cost ~0.4 ms of the event loop. A scan that finds none is
    now repeated only after BUSY_RESCAN_S; a connection idle by then makes room."""
    clock = _Clock()
    abuse = AbuseLog(clock=clock)
    gate = ConnectionGate(10_000, abuse, clock=clock)
    held = [_Connection() for _ in range(10_000)]
    for connection in held:
        assert gate.admit(connection)
    for _ in range(1_000):
        assert not gate.admit(_Connection())
    assert sum(c.asked for c in held) == 10_000  # one scan for the whole flood
    assert abuse.counts["connection limit"] == 1_000
    held[5].idle = True
    clock.now += ConnectionGate.BUSY_RESCAN_S / 2
    assert not gate.admit(_Connection())  # not looked at again yet
    clock.now += ConnectionGate.BUSY_RESCAN_S
    assert gate.admit(_Connection())
    assert held[5].evicted


def test_past_its_limit_the_send_backlog_closes_the_connections_stalled_longest() -> None:
    abuse = AbuseLog()
    backlog = SendBacklog(10, abuse)
    first, second, third = _Connection(), _Connection(), _Connection()
    backlog.hold(first, 4)
    backlog.hold(second, 4)
    assert backlog.held_bytes == 8 and not first.evicted
    backlog.hold(third, 3)  # 11 > 10: the one stalled longest goes, then it fits
    assert first.evicted and not second.evicted and not third.evicted
    assert backlog.held_bytes == 7 and abuse.counts["send backlog"] == 1
    backlog.resumed(second)
    assert backlog.held_bytes == 3
    backlog.hold(third, 30)  # one answer larger than the limit: spared, its own timeout
    assert not third.evicted and backlog.held_bytes == 30
    backlog.resumed(third)
    backlog.resumed(third)  # twice (resumed, then lost): counted once
    assert backlog.held_bytes == 0
    many = _Connection()  # an HTTP/2 connection: many answers on one connection
    backlog.hold(many, 6, answers=2)
    backlog.hold(many, 12, answers=3)  # grows in place; over the limit with several answers
    assert many.evicted and backlog.held_bytes == 0 and abuse.counts["send backlog"] == 2
