"""The Ray Serve application: a KServe v2 ingress that routes by model name to Serval replicas.

    serve run serval.cluster.ray:build_app repository=/models memory_budget=4GiB
    serve deploy deploy/ray/serve.yaml

The ingress reads the model name from the path and calls a `ServalReplica` with it as the
multiplexed model id, so Ray's router prefers replicas that already hold the model; each replica
runs Serval's own data plane (byte-budget LRU registry, batchers, backends, the v2 routes).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import Response

from serval.cluster.config import ClusterConfig
from serval.cluster.placement import PlacementReporter
from serval.cluster.replica import (
    ReplicaStack,
    handle,
    held_models,
    resident_models,
    start_stack,
    stop_stack,
)
from serval.server.http.errors import JSON_HEADERS, Reply, error_body
from serval.server.http.infer_headers import RawHeaders

log = logging.getLogger(__name__)

REPORT_INTERVAL_S = 0.1
_UNSAFE_TO_RETRY = ("/v2/repository/",)  # load/unload change state: never replayed


class ServalReplica:
    """One Serval data plane; answers v2 requests the ingress forwards."""

    async def __init__(self, config: dict[str, Any]) -> None:  # type: ignore[misc]
        self._config = ClusterConfig.parse(config)
        logging.getLogger("serval").setLevel(self._config.log_level.upper())
        self._id = serve.get_replica_context().replica_id.unique_id
        self._stack: ReplicaStack = await start_stack(self._config)
        self._reporter = PlacementReporter(lambda: held_models(self._stack.registry))
        self._reporting = asyncio.create_task(self._report_forever())

    async def handle(self, method: str, path: str, headers: RawHeaders, body: bytes) -> Reply:
        """One v2 request, routed by Serval's HttpApp."""
        model = serve.get_multiplexed_model_id()
        if model:
            self._reporter.requested(model)
        return await handle(self._stack, self._id, method, path, headers, body)

    async def __call__(self, request: Request) -> Response:
        """HTTP straight from Ray's proxy (ingress: false): one hop less; placement then needs
        the client to send the `serve_multiplexed_model_id` header."""
        body = await request.body()
        reply = await self.handle(request.method, request.url.path, list(request.headers.raw),
                                  body)
        return _response(reply)

    def resident(self) -> dict[str, Any]:
        """This replica's id, resident models and bytes (for placement checks and benches)."""
        registry = self._stack.registry
        return {"replica": self._id, "models": sorted(resident_models(registry)),
                "resident_bytes": registry.resident_bytes, "loads": registry.loads,
                "evictions": registry.evictions}

    def check_health(self) -> None:
        """Ray Serve's health probe: a replica whose data plane is not live is replaced."""
        if not self._stack.app.dataplane.live():
            raise RuntimeError("Serval data plane is not live")

    async def __del__(self) -> None:
        """Ray Serve's graceful-shutdown hook: finish in-flight requests, release engines."""
        self._reporting.cancel()
        await stop_stack(self._stack)

    async def _report_forever(self) -> None:
        while True:
            try:
                self._reporter.report()
            except Exception:
                log.exception("pushing this replica's models to Ray Serve failed")
            await asyncio.sleep(REPORT_INTERVAL_S)


class ServalIngress:
    """The HTTP entry: model name from the path becomes the multiplexed model id."""

    def __init__(self, replicas: DeploymentHandle[Any], retries: int) -> None:
        self._replicas = replicas
        self._retries = retries

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        method = request.method
        body = await request.body()
        headers: RawHeaders = list(request.headers.raw)
        model = model_of(path)
        target = self._replicas.options(multiplexed_model_id=model) if model else self._replicas
        attempts = 1 + (self._retries if retry_safe(path) else 0)
        return _response(await _call(target, attempts, method, path, headers, body))


def _response(reply: Reply) -> Response:
    status, payload, headers = reply
    return Response(payload, status_code=status,
                    headers={k.decode("latin-1"): v.decode("latin-1") for k, v in headers})


async def _call(target: DeploymentHandle[Any], attempts: int, method: str, path: str,
                headers: RawHeaders, body: bytes) -> Reply:
    """Call a replica; a replica that dies mid-request is replaced by a retry where safe."""
    for attempt in range(attempts):
        try:
            reply: Reply = await target.handle.remote(method, path, headers, body)
            return reply
        except RayActorError as exc:
            log.warning("replica died during %s %s (attempt %d/%d): %s", method, path,
                        attempt + 1, attempts, exc)
    return 503, error_body(f"the replica serving {path} died and the request was not retried"
                           if attempts == 1 else
                           f"replicas died during {attempts} attempts of {path}"), list(
        JSON_HEADERS)


def model_of(path: str) -> str:
    """The model a v2 path addresses ('' for server-wide routes)."""
    parts = path.strip("/").split("/")
    if len(parts) >= 3 and parts[:2] == ["v2", "models"] and parts[2] != "stats":
        return parts[2]
    if len(parts) >= 4 and parts[:3] == ["v2", "repository", "models"]:
        return parts[3]
    return ""


def retry_safe(path: str) -> bool:
    """Every v2 route but repository control is free of side effects, so replaying is safe."""
    return not path.startswith(_UNSAFE_TO_RETRY)


def build_app(args: dict[str, Any]) -> serve.Application:
    """The application builder `serve run`/`serve deploy` import (args: ClusterConfig)."""
    config = ClusterConfig.parse(dict(args))
    replica = serve.deployment(
        name="ServalReplica", num_replicas=config.num_replicas,
        autoscaling_config=config.autoscaling(),
        max_ongoing_requests=config.max_ongoing_requests,
        ray_actor_options={"num_cpus": config.replica_cpus},
        health_check_period_s=5, health_check_timeout_s=30, graceful_shutdown_timeout_s=30,
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    )(ServalReplica)
    if not config.ingress:
        direct: serve.Application = replica.bind(config.model_dump(mode="json"))
        return direct
    ingress = serve.deployment(
        name="ServalIngress", num_replicas=config.ingress_replicas,
        max_ongoing_requests=4 * config.max_ongoing_requests,
        ray_actor_options={"num_cpus": 0},
        logging_config={"enable_access_log": False, "log_level": "WARNING"},
    )(ServalIngress)
    app: serve.Application = ingress.bind(replica.bind(config.model_dump(mode="json")),
                                          config.retries)
    return app


