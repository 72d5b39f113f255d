"""grpc.health.v1.Health: the gRPC Health Checking Protocol over the server's readiness, for
Kubernetes' `grpc` probes, grpc_health_probe and grpc's client-side health checking (as
Triton answers it on its gRPC port). Open, as the v2 liveness and readiness RPCs are.

The service "" (the whole server) and "inference.GRPCInferenceService" are SERVING while the
server is ready (v2 ServerReady), NOT_SERVING while it starts, drains or (strict readiness) a
model that should serve does not; any other name is NOT_FOUND for Check, SERVICE_UNKNOWN for
Watch. Watch sends the status at once and again on each change, and ends when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from serval.dataplane import DataPlane
from serval.protocol.grpc import health_pb2 as pb
from serval.protocol.grpc.status import GrpcStatus

SERVICES = ("", "inference.GRPCInferenceService")
WATCH_POLL_S = 1.0  # how often an open Watch looks at the server's readiness


class HealthServicer:
    """Check and Watch over one DataPlane's readiness."""

    SERVICE = pb.DESCRIPTOR.services_by_name["Health"]
    MESSAGES = pb

    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane
        self.stopping = asyncio.Event()  # set when the server stops: open Watches end
        self._seen = (-WATCH_POLL_S, pb.HealthCheckResponse.UNKNOWN)  # (loop time, status)

    async def Check(self, request: Any, context: Any) -> pb.HealthCheckResponse:
        if request.service not in SERVICES:
            await context.abort(GrpcStatus.NOT_FOUND,
                                f"unknown service '{request.service[:200]}'; this server "
                                f"answers for {', '.join(repr(s) for s in SERVICES)}")
        return pb.HealthCheckResponse(status=self._status())

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[pb.HealthCheckResponse]:
        if request.service not in SERVICES:  # the protocol: say so, keep the call open
            yield pb.HealthCheckResponse(status=pb.HealthCheckResponse.SERVICE_UNKNOWN)
            await self.stopping.wait()
            return
        sent = None
        while True:
            status = self._status(shared=True)
            if status != sent:
                yield pb.HealthCheckResponse(status=status)
                sent = status
            if self.stopping.is_set():
                if sent != pb.HealthCheckResponse.NOT_SERVING:
                    yield pb.HealthCheckResponse(status=pb.HealthCheckResponse.NOT_SERVING)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), WATCH_POLL_S)

    def _status(self, shared: bool = False) -> pb.HealthCheckResponse.ServingStatus:
        """The server's status; `shared`: at most one look per half poll for all Watches (a
        readiness check with strict readiness looks at every model that should serve)."""
        loop = asyncio.get_running_loop()
        seen_at, status = self._seen
        if shared and loop.time() - seen_at < WATCH_POLL_S / 2:
            return status
        status = (pb.HealthCheckResponse.SERVING if self.dataplane.ready() and
                  not self.stopping.is_set() else pb.HealthCheckResponse.NOT_SERVING)
        self._seen = (loop.time(), status)
        return status
