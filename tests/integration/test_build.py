"""The one server builder, in process: `serve`'s server and a cluster node's stack are built from
the same settings (auth, limits, metrics_top_k, the status sampler) and honour them alike."""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import Awaitable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import orjson
import pytest

from serval.auth import create_token
from serval.cluster.config import ClusterConfig
from serval.cluster.replica import REPLICA_HEADER, handle, start_stack, stop_stack
from serval.config import ServerConfig, TransportLimits
from serval.server.build import (
    SAMPLER_TASK,
    Server,
    ServingStack,
    start_server,
    stop_server,
)
from tests import fixture_models
from tests.integration.http_helpers import call, infer

pytestmark = pytest.mark.integration
T = TypeVar("T")
LIMIT_BYTES = 4096
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}
# a valid request padded with spaces: small on the wire, past LIMIT_BYTES once inflated
PADDED = orjson.dumps(X) + b" " * (2 * LIMIT_BYTES)


class LoopThread:
    """An event loop on a thread, so the test can call the server with blocking clients."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[T], timeout_s: float = 60.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]
        return future.result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    root = tmp_path_factory.mktemp("build")
    repository = root / "models"
    fixture_models.linear(repository)
    fixture_models.linear(repository, "linear2", seed=1)
    tokens = root / "tokens.yaml"
    return repository, tokens, create_token(tokens, ["admin"], "test")


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_serve_builds_a_server_with_every_setting(settings: tuple[Path, Path, str],
                                                  loop: LoopThread) -> None:
    repository, tokens, token = settings
    config = ServerConfig(repository=repository, http_port=0, grpc_port=0, auth_tokens=tokens,
                          metrics_top_k=1, limits=TransportLimits(max_request_bytes=LIMIT_BYTES))
    server: Server = loop.run(start_server(config))
    try:
        url = f"127.0.0.1:{server.http_port}"
        assert server.grpc is None and server.stack.dataplane.ready()
        assert call(url, "GET", "/v2/health/ready").status == 200
        assert infer(url, "linear", X).status == 401
        for model in ("linear", "linear2"):
            assert infer(url, model, X, _bearer(token)).status == 200
        metrics = call(url, "GET", "/metrics", headers=_bearer(token)).body.decode()
        assert 'model="_other"' in metrics  # metrics_top_k 1: the other model is summed
        gzipped = gzip.compress(PADDED)
        assert len(gzipped) < LIMIT_BYTES
        too_big = call(url, "POST", "/v2/models/linear/infer", gzipped,
                       {**_bearer(token), "Content-Encoding": "gzip"})
        assert too_big.status == 413
        assert _sampling(server.stack)
    finally:
        loop.run(stop_server(server, 5.0))
    assert not server.stack.dataplane.ready()


def _sampling(stack: ServingStack) -> bool:
    return any(task.get_name() == SAMPLER_TASK and not task.done() for task in stack.tasks)


def _reply(stack: ServingStack, path: str, body: bytes, headers: dict[str, str],
           loop: LoopThread) -> tuple[int, dict[bytes, bytes]]:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    status, _, reply_headers = loop.run(handle(stack, "r1", "POST", path, raw, body))
    return status, dict(reply_headers)


def test_a_cluster_node_takes_the_same_settings_as_serve(settings: tuple[Path, Path, str],
                                                         loop: LoopThread) -> None:
    repository, tokens, token = settings
    config = ClusterConfig.parse({
        "repository": str(repository), "auth_tokens": str(tokens), "metrics_top_k": 1,
        "limits": {"max_request_bytes": LIMIT_BYTES}, "poll_interval_s": 0})
    stack: ServingStack = loop.run(start_stack(config))
    try:
        path = "/v2/models/linear/infer"
        status, headers = _reply(stack, path, orjson.dumps(X), {}, loop)
        assert status == 401 and headers[REPLICA_HEADER] == b"r1"
        status, _ = _reply(stack, path, orjson.dumps(X), _bearer(token), loop)
        assert status == 200
        status, _ = _reply(stack, path, gzip.compress(PADDED),
                           {**_bearer(token), "Content-Encoding": "gzip"}, loop)
        assert status == 413
        assert stack.app.max_body_bytes == LIMIT_BYTES
        assert stack.config.metrics_top_k == 1 and stack.config.model_control == "lazy"
        assert _sampling(stack)  # the status page has its samples here too
    finally:
        loop.run(stop_stack(stack))


