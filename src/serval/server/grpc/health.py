"""grpc.health.v1.Health: the gRPC Health Checking Protocol over the server's readiness, for
Kubernetes' `grpc` probes, grpc_health_probe and grpc's client-side health checking (as
Triton answers it on its gRPC port). Open, as the v2 liveness and readiness RPCs are.

The answer is the server's: SERVING while it is ready (v2 ServerReady), NOT_SERVING while it
starts, drains or (strict readiness) a model that should serve does not. As Triton's, it is the
same whatever service the request names, so a probe set up against Triton with a service name
passes here too. Watch sends the status at once and again on each change, and ends when the
server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from serval.dataplane import DataPlane
from serval.protocol.grpc import health_pb2 as pb

WATCH_POLL_S = 1.0  # how often an open Watch looks at the server's readiness


class HealthServicer:
    """Check and Watch over one DataPlane's readiness. Open Watches cost nothing while the
    status holds: one poller (running while any Watch is open) looks once per WATCH_POLL_S and
    wakes them only when it changes."""

    SERVICE = pb.DESCRIPTOR.services_by_name["Health"]
    MESSAGES = pb

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.stopping = asyncio.Event()  # set when the server stops: open Watches end
        self._current = pb.HealthCheckResponse.UNKNOWN  # what the poller saw last
        self._changed = asyncio.Event()  # set (and replaced) when _current changes or stop
        self._watchers = 0
        self._poller: asyncio.Task[None] | None = None

    async def Check(self, request: Any, context: Any) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(status=self._status())

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[pb.HealthCheckResponse]:
        self._watchers += 1
        try:
            if self._poller is None:
                self._current = self._status()
                self._poller = asyncio.create_task(self._poll(), name="serval-health-watch")
            sent = None
            while True:
                changed = self._changed
                if self._current != sent:
                    sent = self._current
                    yield pb.HealthCheckResponse(status=sent)
                if self.stopping.is_set():
                    return
                await changed.wait()
        finally:
            self._watchers -= 1

    async def _poll(self) -> None:
        """While any Watch is open: the status once per WATCH_POLL_S; its Watches woken on a
        change, and when the server stops (NOT_SERVING, then they end)."""
        try:
            while self._watchers and not self.stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), WATCH_POLL_S)
                status = self._status()
                if status != self._current or self.stopping.is_set():
                    self._current = status
                    self._changed.set()
                    self._changed = asyncio.Event()
        finally:
            self._poller = None

    def _status(self) -> pb.HealthCheckResponse.ServingStatus:
        ready = self.dataplane.ready() and not self.stopping.is_set()
        return pb.HealthCheckResponse.SERVING if ready else pb.HealthCheckResponse.NOT_SERVING
