"""What one client may take from the server: the transports' limits, timeouts and budgets.

Serval runs its own HTTP/1.1 and HTTP/2 stacks, so every guard nginx, uvicorn, h2 or grpcio
would give is here: sizes checked before anything is buffered, timeouts on every phase of a
connection, and two server-wide budgets shared by both transports:

- `ConnectionGate`: open connections (HTTP and gRPC together). At the limit a new connection
  takes the place of the oldest one that has no request in progress; if every connection is busy,
  the new one is closed at once. Slow or idle connections can never lock good clients out.
- `ReceiveBudget`: bytes of request bodies and gRPC messages held by the server, from the moment
  their size is known until their answer is written. Past it, new requests are refused (429 /
  RESOURCE_EXHAUSTED) before their bytes are read. (Both transports check that an announced
  size fits when it is announced but reserve bytes as they arrive: a client that announces
  64 MiB and sends a byte a minute holds a byte, not the budget; and body_timeout_s ends a
  request that pauses.)
"""

from __future__ import annotations

import logging
import resource
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from serval.config import TransportLimits

log = logging.getLogger(__name__)

_FDS_KEPT_BACK = 512  # for model files, the repository watcher, worker pipes, logs


def auto_max_connections() -> int:
    """Raise the soft descriptor limit to the hard one; allow all but a reserve, at most 10,000."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        wanted = 65_536 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return max(64, min(10_000, soft - _FDS_KEPT_BACK))


class GatedConnection(Protocol):
    """What the gate needs of a connection."""

    def is_idle(self) -> bool:
        """True when no request is in progress (idle keep-alive, or still sending its first
        request's headers, or an HTTP/2 connection with no open stream)."""

    def evict(self) -> None:
        """Close now to make room (the connection may say why, e.g. GOAWAY)."""


class ConnectionGate:
    """The server's open connections, both transports. At the limit a new one takes the place of
    an idle one: first of those that never finished a request (a slowloris open, a client
    still sending its first request), oldest first; then of those that did, the one idle
    longest (nginx likewise reuses its least recently used keep-alive connections). So a
    flood of opens never pushes out a client's keep-alive connection between two calls.

    At the limit, finding an idle connection to close scans them (~0.4 ms for 10,000): a
    scan that finds none is not repeated for BUSY_RESCAN_S, so a flood of new connections
    while every slot is busy costs a refusal each, not a scan each."""

    BUSY_RESCAN_S = 0.05

    def __init__(self, max_connections: int, log: AbuseLog,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_connections = max_connections
        self.fresh: dict[GatedConnection, None] = {}  # no request finished; oldest first
        self.served: OrderedDict[GatedConnection, None] = OrderedDict()  # least recent first
        self._log = log
        self._clock = clock
        self._all_busy_at = float("-inf")  # when a scan last found every connection busy

    @property
    def count(self) -> int:
        return len(self.fresh) + len(self.served)

    def admit(self, connection: GatedConnection) -> bool:
        """Register a new connection; False: no room (the caller closes it)."""
        if len(self.fresh) + len(self.served) >= self.max_connections:
            now = self._clock()
            victim = None
            if now - self._all_busy_at >= self.BUSY_RESCAN_S:
                victim = next((c for c in self.fresh if c.is_idle()), None)
                if victim is None:
                    victim = next((c for c in self.served if c.is_idle()), None)
                if victim is None:
                    self._all_busy_at = now
            if victim is None:
                self._log.closed("connection limit", f"at the limit of {self.max_connections} "
                                 "connections, none idle: refused a new one (--max-connections)")
                return False
            self.release(victim)
            self._log.closed("connection limit", f"at the limit of {self.max_connections} "
                             "connections: closed an idle one (--max-connections)")
            victim.evict()
        self.fresh[connection] = None
        return True

    def touch(self, connection: GatedConnection) -> None:
        """`connection` finished a request (or its last open stream): last in line."""
        try:
            self.served.move_to_end(connection)
        except KeyError:  # its first request, or closed meanwhile
            if self.fresh.pop(connection, 0) is None:
                self.served[connection] = None

    def release(self, connection: GatedConnection) -> None:
        if self.fresh.pop(connection, 0) is not None:  # (None: it was there)
            self.served.pop(connection, None)


class ReceiveBudget:
    """Bytes of requests the server holds at once, server-wide."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self.refused = 0

    def reserve(self, size_bytes: int) -> bool:
        """Take size_bytes if they fit; False (and nothing taken) if not."""
        if not self.fits(size_bytes):
            return False
        self.held_bytes += size_bytes
        return True

    def fits(self, size_bytes: int) -> bool:
        """Whether size_bytes would fit now (nothing taken); a False counts as a refusal."""
        if self.held_bytes + size_bytes > self.limit_bytes:
            self.refused += 1
            return False
        return True

    def release(self, size_bytes: int) -> None:
        self.held_bytes = max(0, self.held_bytes - size_bytes)

    def refusal_message(self, size_bytes: int) -> str:
        return (f"the server holds {self.held_bytes} bytes of requests, its limit is "
                f"{self.limit_bytes} (--receive-budget-mb); this request of {size_bytes} bytes "
                "must wait: retry shortly")


class Stalled(Protocol):
    """What the send backlog needs of a connection."""

    def abort(self) -> None:
        """Close now, dropping what is unsent."""


class SendBacklog:
    """Bytes of answers written but not yet taken by their clients, server-wide, counted for
    connections holding more than their write-buffer mark unsent (HTTP/1.1: its writing
    paused; HTTP/2: replies waiting for flow-control window or the socket).

    A client that reads nothing holds its answers until the write-stall timeout; many such
    clients (or one asking on many connections or streams for answers far larger than its
    requests) could make the server hold answers without bound meanwhile. Past `limit_bytes`
    (the receive budget's size) the connections stalled longest are aborted at once, a write
    stall cut short. The connection that has just grown is spared while it holds a single
    answer (one larger than the limit keeps its own timeout): at most the limit plus one
    answer is held.
    """

    def __init__(self, limit_bytes: int, log: AbuseLog) -> None:
        self.limit_bytes = limit_bytes
        self.held_bytes = 0
        self._held: dict[Stalled, int] = {}  # insertion order: stalled longest first
        self._log = log

    def hold(self, connection: Stalled, unsent_bytes: int, answers: int = 1) -> None:
        """The connection holds `unsent_bytes` of `answers` answers now (its place in line
        kept while it stays held)."""
        self.held_bytes += unsent_bytes - self._held.get(connection, 0)
        self._held[connection] = unsent_bytes
        while self.held_bytes > self.limit_bytes:
            victim = next(iter(self._held))
            if victim is connection and answers <= 1 and len(self._held) == 1:
                return
            self.resumed(victim)
            self._log.closed("send backlog", "answers not taken by their clients passed "
                             f"{self.limit_bytes} bytes server-wide (--receive-budget-mb): "
                             "closed the connection that had stalled longest")
            victim.abort()

    def resumed(self, connection: Stalled) -> None:
        unsent = self._held.pop(connection, None)
        if unsent is not None:
            self.held_bytes -= unsent


class AbuseLog:
    """Connections closed for abuse: one warning line per kind at most every `interval_s`.

    An attack closes thousands of connections; the log says what happened and how often, once
    per kind and interval, never a line per connection and never at ERROR.
    """

    # every kind the transports close for, counted from 0 (the metric's series exist up front)
    KINDS = ("connection limit", "header timeout", "body timeout", "header limit",
             "request limit", "malformed", "write stall", "send backlog", "stalled gRPC request",
             "http2 flood")

    def __init__(self, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.counts: dict[str, int] = dict.fromkeys(self.KINDS, 0)
        self._warned_at: dict[str, float] = {}
        self._clock = clock

    def closed(self, kind: str, why: str) -> None:
        """Count one connection closed for `kind`; warn if this kind was quiet long enough."""
        count = self.counts[kind] = self.counts.get(kind, 0) + 1
        now = self._clock()
        if now - self._warned_at.get(kind, float("-inf")) >= self.interval_s:
            self._warned_at[kind] = now
            log.warning("closed a connection: %s (%s: %d so far)", why, kind, count)


@dataclass(frozen=True, slots=True)
class TransportGuards:
    """What every connection of one server shares: its limits, the server-wide budgets and
    the backlog of answers not taken."""

    limits: TransportLimits
    gate: ConnectionGate
    budget: ReceiveBudget
    abuse: AbuseLog
    backlog: SendBacklog

    @classmethod
    def build(cls, limits: TransportLimits) -> TransportGuards:
        if not limits.max_connections:
            limits = replace(limits, max_connections=auto_max_connections())
        abuse = AbuseLog()
        return cls(limits, ConnectionGate(limits.max_connections, abuse),
                   ReceiveBudget(limits.receive_budget_bytes), abuse,
                   SendBacklog(limits.receive_budget_bytes, abuse))
