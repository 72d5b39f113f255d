"""Holding under load: bounded queues (429 + Retry-After), in-flight limit, request deadlines."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import orjson
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import (
    Reply,
    call,
    inference_count,
    metric,
    occupy,
    wait_until_idle,
    wait_until_queued,
)

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]
BIG = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [128, 1024],
                                "data": [0.01] * (128 * 1024)}],
                    "parameters": {"timeout": 0}})  # its own: no deadline, whatever the default


def _one_row(parameters: dict[str, object] | None = None) -> bytes:
    doc: dict[str, object] = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1024],
                                          "data": [0.1] * 1024}]}
    if parameters:
        doc["parameters"] = parameters
    return orjson.dumps(doc)


def _slow_repository(root: Path, config: str = "max_batch_size: 128\n") -> Path:
    fixture_models.slow(root)
    (root / "slow" / "config.yaml").write_text(config)
    return root


def _occupy(server: RunningServer) -> threading.Thread:
    """A 128-row batch of `slow` in the engine; returns once it is computing."""
    return occupy(server.url, "slow", BIG)


def _computed_rows(server: RunningServer) -> int:
    return inference_count(server.url, "slow")


def _post_many(server: RunningServer, count: int, body: bytes,
               headers: dict[str, str] | None = None) -> list[Reply]:
    replies: list[Reply] = []
    threads = [threading.Thread(target=lambda: replies.append(
        call(server.url, "POST", "/v2/models/slow/infer", body, headers)))
        for _ in range(count)]
    for thread in threads:
        thread.start()
        time.sleep(0.01)  # arrive in order
    for thread in threads:
        thread.join(timeout=60)
    return replies


def test_a_full_queue_refuses_with_429_and_retry_after(server_factory: Factory,
                                                       tmp_path: Path) -> None:
    root = _slow_repository(tmp_path, "max_batch_size: 128\nbatching:\n  max_queue_size: 2\n")
    server = server_factory(root)
    blocker = _occupy(server)
    replies = _post_many(server, 6, _one_row())
    blocker.join(timeout=60)
    refused = [r for r in replies if r.status == 429]
    assert refused and all(r.status in (200, 429) for r in replies)
    assert "max_queue_size" in refused[0].error and int(refused[0].headers["retry-after"]) >= 1
    metrics = call(server.url, "GET", "/metrics").body.decode()
    counted = f'serval_requests_total{{model="slow",outcome="overloaded",version="1"}} ' \
        f'{float(len(refused))}'
    assert counted in metrics  # refusals are counted
    assert call(server.url, "POST", "/v2/models/slow/infer", _one_row()).status == 200


def test_the_server_wide_inflight_limit(server_factory: Factory, tmp_path: Path) -> None:
    server = server_factory(_slow_repository(tmp_path), "--max-inflight", "1")
    blocker = _occupy(server)
    assert metric(server.url, "serval_inflight_limit") == 1
    assert metric(server.url, "serval_inflight_requests") == 1  # the blocker
    refused = call(server.url, "POST", "/v2/models/slow/infer", _one_row())
    assert refused.status == 429 and "in flight" in refused.error
    assert metric(server.url, "serval_inflight_refusals_total") == 1  # counted server-wide
    blocker.join(timeout=60)
    assert call(server.url, "POST", "/v2/models/slow/infer", _one_row()).status == 200
    assert metric(server.url, "serval_inflight_requests") == 0


def test_grpc_twin_of_a_full_queue(server_factory: Factory, tmp_path: Path) -> None:
    server = server_factory(_slow_repository(tmp_path), "--max-inflight", "1")
    blocker = _occupy(server)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))
    request = service_pb2.ModelInferRequest(model_name="slow")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 1024])
    request.raw_input_contents.append(np.zeros(1024, np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    blocker.join(timeout=60)


@pytest.mark.parametrize("how", ["parameter", "header", "server default"])
def test_a_request_whose_deadline_passes_in_the_queue_gets_504(
    server_factory: Factory, tmp_path: Path, how: str
) -> None:
    extra = ["--default-timeout-ms", "50"] if how == "server default" else []
    """The request waits behind a running batch and a queued one (each ~0.1-0.5 s), so its
    50 ms pass while it is queued however fast this machine runs the first batch."""
    server = server_factory(_slow_repository(tmp_path), *extra)
    before = _computed_rows(server)
    blocker = _occupy(server)
    queued = threading.Thread(target=call, args=(server.url, "POST", "/v2/models/slow/infer",
                                                 BIG))
    queued.start()
    wait_until_queued(server.url, "slow", 1)
    body = _one_row({"timeout": 50_000} if how == "parameter" else None)
    headers = {"Serval-Timeout-Ms": "50"} if how == "header" else None
    reply = call(server.url, "POST", "/v2/models/slow/infer", body, headers)
    blocker.join(timeout=60)
    queued.join(timeout=60)
    assert reply.status == 504 and "deadline" in reply.error
    wait_until_idle(server.url, "slow")  # the expired request has been taken from the queue
    assert _computed_rows(server) == before + 256  # only the two big requests were computed


@pytest.mark.parametrize(("parameters", "headers", "message"), [
    ({"timeout": -5}, None, "non-negative integer of microseconds"),
    ({"timeout": "soon"}, None, "non-negative integer of microseconds"),
    (None, {"Serval-Timeout-Ms": "zero"}, "Serval-Timeout-Ms must be a positive number"),
])
def test_bad_timeouts_are_400(server_factory: Factory, tmp_path: Path,
                              parameters: dict[str, object] | None,
                              headers: dict[str, str] | None, message: str) -> None:
    server = server_factory(_slow_repository(tmp_path))
    reply = call(server.url, "POST", "/v2/models/slow/infer", _one_row(parameters), headers)
    assert reply.status == 400 and message in reply.error
