"""Admission by expected wait: a request whose deadline the queue ahead would make it miss is
refused at once (429 + Retry-After, gRPC RESOURCE_EXHAUSTED) instead of queueing, while one
whose deadline can be met is served; a connection that re-sends before its Retry-After gets
its next 429 only when that elapses, without the request reaching the model (requests for
other models on that connection are answered as usual)."""

from __future__ import annotations

import http.client
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
    call,
    inference_count,
    occupy,
    wait_until_idle,
    wait_until_running,
)

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]
INFER = "/v2/models/slow/infer"
BIG = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [128, 1024],
                                "data": [0.01] * (128 * 1024)}]})
ONE_ROW = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1024],
                                    "data": [0.1] * 1024}]})


@pytest.fixture(scope="module")
def measured(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory
             ) -> RunningServer:
    """The `slow` model (~0.1-0.5 s a 128-row batch) with two batches measured already, and
    `add_sub` beside it."""
    root = tmp_path_factory.mktemp("overload")
    fixture_models.slow(root)
    fixture_models.add_sub(root)
    (root / "slow" / "config.yaml").write_text("max_batch_size: 128\n")
    server = server_factory(root)
    for _ in range(2):
        assert call(server.url, "POST", INFER, BIG).status == 200
    return server


def _occupy(server: RunningServer) -> threading.Thread:
    """A 128-row batch of `slow` in the engine; returns once it is computing."""
    return occupy(server.url, "slow", BIG)


def _keep_alive(server: RunningServer) -> http.client.HTTPConnection:
    """One keep-alive connection: what a Retry-After holds is per connection."""
    host, port = server.url.split(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


def _computed_rows(server: RunningServer) -> int:
    return inference_count(server.url, "slow")


def _grpc_request() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="slow")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 1024])
    request.raw_input_contents.append(np.full(1024, 0.1, np.float32).tobytes())
    return request


def test_http_a_deadline_that_cannot_be_met_is_refused_at_once_one_that_can_is_served(
    measured: RunningServer,
) -> None:
    blocker = _occupy(measured)
    before = _computed_rows(measured)
    started = time.monotonic()
    refused = call(measured.url, "POST", INFER, ONE_ROW, {"Serval-Timeout-Ms": "5"})
    refused_after_s = time.monotonic() - started
    still_running = blocker.is_alive()
    served = call(measured.url, "POST", INFER, ONE_ROW, {"Serval-Timeout-Ms": "30000"})
    blocker.join(timeout=60)
    assert refused.status == 429, refused.body
    assert "cannot answer before the request's deadline" in refused.error
    assert int(refused.headers["retry-after"]) >= 1
    assert still_running and refused_after_s < 0.5  # refused, not queued behind the batch
    assert served.status == 200, served.body
    wait_until_idle(measured.url, "slow")  # nothing queued could still run after the check
    assert _computed_rows(measured) == before + 128 + 1  # the refused row never ran


def test_http_server_default_timeout_is_the_deadline_admission_judges(
    server_factory: Factory, tmp_path: Path,
) -> None:
    fixture_models.slow(tmp_path)
    (tmp_path / "slow" / "config.yaml").write_text("max_batch_size: 128\n")
    server = server_factory(tmp_path, "--default-timeout-ms", "5")
    no_deadline = orjson.dumps({**orjson.loads(BIG), "parameters": {"timeout": 0}})
    assert call(server.url, "POST", INFER, no_deadline).status == 200  # measured once
    blocker = threading.Thread(target=call, args=(server.url, "POST", INFER, no_deadline))
    blocker.start()
    wait_until_running(server.url, "slow")
    refused = call(server.url, "POST", INFER, ONE_ROW)
    served = call(server.url, "POST", INFER, ONE_ROW, {"Serval-Timeout-Ms": "30000"})
    blocker.join(timeout=60)
    assert refused.status == 429 and "retry-after" in refused.headers
    assert served.status == 200


def test_grpc_a_deadline_that_cannot_be_met_is_refused_at_once_one_that_can_is_served(
    measured: RunningServer,
) -> None:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(measured.grpc_url))
    stub.ModelInfer(_grpc_request(), timeout=30)  # the channel is up before the clock starts
    blocker = _occupy(measured)
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(_grpc_request(), timeout=0.02)
    refused_after_s = time.monotonic() - started
    still_running = blocker.is_alive()
    served = stub.ModelInfer(_grpc_request(), timeout=30)
    blocker.join(timeout=60)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
    assert "cannot answer before the request's deadline" in (caught.value.details() or "")
    # when to retry, as gRFC A6 says (grpc-core's retry policy waits for it): HTTP's Retry-After
    pushback = dict(caught.value.trailing_metadata() or ())["grpc-retry-pushback-ms"]
    assert 1 <= int(pushback) <= 60_000
    assert still_running and refused_after_s < 0.5
    assert served.outputs and served.outputs[0].shape == [1, 1024]


def test_a_connection_resending_before_retry_after_is_refused_when_it_elapses(
    measured: RunningServer,
) -> None:
    blocker = _occupy(measured)
    connection = _keep_alive(measured)
    headers = {"Serval-Timeout-Ms": "5", "Content-Type": "application/json"}
    try:
        connection.request("POST", INFER, ONE_ROW, headers)
        first = connection.getresponse()
        first.read()
        retry_after = int(first.headers["retry-after"])
        started = time.monotonic()
        connection.request("POST", INFER, ONE_ROW, {**headers, "Serval-Timeout-Ms": "30000"})
        second = connection.getresponse()
        second_body = second.read()
        held_s = time.monotonic() - started
    finally:
        connection.close()
        blocker.join(timeout=60)
    assert first.status == 429 and second.status == 429
    assert "before its Retry-After elapsed" in orjson.loads(second_body)["error"]
    assert retry_after - 0.3 <= held_s <= retry_after + 2.0
    assert call(measured.url, "POST", INFER, ONE_ROW).status == 200  # a new connection is fine


def test_a_retry_after_holds_back_only_its_model_on_the_connection(
    measured: RunningServer,
) -> None:
    """A proxy's connection carries many clients: one model's 429 must not hold the others."""
    blocker = _occupy(measured)
    connection = _keep_alive(measured)
    other = orjson.dumps({"inputs": [
        {"name": n, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}
        for n in ("INPUT0", "INPUT1")]})
    try:
        connection.request("POST", INFER, ONE_ROW, {"Serval-Timeout-Ms": "5"})
        first = connection.getresponse()
        first.read()
        answers = []
        started = time.monotonic()  # a held request would be answered when Retry-After elapsed
        for method, path, body in (("POST", "/v2/models/add_sub/infer", other),
                                   ("GET", "/v2/health/ready", None),
                                   ("GET", "/v2/models/add_sub", None)):
            connection.request(method, path, body)
            answer = connection.getresponse()
            answers.append((answer.status, answer.read()))
        early_s = float(first.headers["retry-after"]) - (time.monotonic() - started)
    finally:
        connection.close()
        blocker.join(timeout=60)
    assert first.status == 429
    assert [status for status, _ in answers] == [200, 200, 200], answers
    assert orjson.loads(answers[0][1])["outputs"][0]["data"] == [2.0] * 16
    assert early_s > 0  # all three were answered within the Retry-After: none was held
