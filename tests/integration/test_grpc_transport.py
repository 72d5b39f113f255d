"""Serval's HTTP/2 gRPC transport against real clients: flow control, compression, limits,
protocol abuse, drain on SIGTERM, and the raw-HTTP/2 load generator.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from serval.loadtest.grpc_closed_loop import run_grpc_closed_loop
from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]


@pytest.fixture(scope="module")
def heavy_server(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory
                 ) -> tuple[RunningServer, Path]:
    root = tmp_path_factory.mktemp("heavy-repository")
    fixture_models.heavy(root)
    fixture_models.linear(root)
    return server_factory(root, "--grpc-max-message-mb", "1"), root


def _heavy_input(rows: int) -> triton.InferInput:
    x = np.random.default_rng(rows).standard_normal((rows, 384)).astype(np.float32)
    infer_input = triton.InferInput("x", list(x.shape), "FP32")
    infer_input.set_data_from_numpy(x)
    return infer_input


def _expected(root: Path, infer_input: triton.InferInput, rows: int) -> np.ndarray:
    x = np.random.default_rng(rows).standard_normal((rows, 384)).astype(np.float32)
    session = ort.InferenceSession(str(root / "heavy" / "1" / "model.onnx"))
    return np.asarray(session.run(None, {"x": x})[0])


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_messages_larger_than_every_window_and_frame(
        heavy_server: tuple[RunningServer, Path], compression: str | None) -> None:
    server, root = heavy_server
    rows = 128  # 196 KB each way: beyond the 64 KB default windows and 16 KB frames
    client = triton.InferenceServerClient(server.grpc_url)
    infer_input = _heavy_input(rows)
    result = client.infer("heavy", [infer_input], compression_algorithm=compression)
    np.testing.assert_allclose(result.as_numpy("y"), _expected(root, infer_input, rows),
                               rtol=1e-5, atol=1e-5)


def test_a_message_over_the_limit_is_resource_exhausted(
        heavy_server: tuple[RunningServer, Path]) -> None:
    server, _ = heavy_server
    client = triton.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("heavy", [_heavy_input(1024)])  # 1.5 MB > --grpc-max-message-mb 1
    assert "RESOURCE_EXHAUSTED" in str(caught.value.status())
    assert "larger than max" in caught.value.message()
    assert client.is_server_live()  # the connection and the server carry on


def test_unknown_methods_are_unimplemented(heavy_server: tuple[RunningServer, Path]) -> None:
    server, _ = heavy_server
    channel = grpc.insecure_channel(server.grpc_url)
    nope = channel.unary_unary("/inference.GRPCInferenceService/Nope")
    with pytest.raises(grpc.RpcError) as caught:
        nope(b"")
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_garbage_and_http1_clients_are_closed_without_harm(
        heavy_server: tuple[RunningServer, Path]) -> None:
    server, _ = heavy_server
    for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                 + b"\x00\xff\xff\x00\x00\x00\x00\x00\x01" + b"x" * 70_000):
        with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=5) as sock:
            sock.sendall(junk)
            sock.settimeout(5)
            while sock.recv(65_536):  # until the server closes (GOAWAY may come first)
                pass
    assert triton.InferenceServerClient(server.grpc_url).is_model_ready("heavy")


def test_load_generator_counts_match_the_servers_statistics(
        heavy_server: tuple[RunningServer, Path]) -> None:
    server, _ = heavy_server
    request = _linear_request("linear")
    before = _inferences(server)
    results = [run_grpc_closed_loop(server.grpc_url, [request], 8, 0.5,
                                    warmup_s=0.2, mode=mode) for mode in ("unary", "stream")]
    for result in results:
        assert result.errors == {} and result.requests > 10
    unary, stream = (result.sample_body for result in results)
    assert service_pb2.ModelInferResponse.FromString(unary).model_name == "linear"
    streamed = service_pb2.ModelStreamInferResponse.FromString(stream)
    assert streamed.infer_response.model_name == "linear" and not streamed.error_message
    # every answer (warm-up included) was one inference on the server
    assert _inferences(server) - before == sum(result.answered for result in results)


def test_load_generator_counts_errors_by_status(
        heavy_server: tuple[RunningServer, Path]) -> None:
    server, _ = heavy_server
    result = run_grpc_closed_loop(server.grpc_url, [_linear_request("missing")], 2, 0.3,
                                  warmup_s=0.0)
    assert result.requests == 0 and result.errors.get("grpc_not_found", 0) > 0


def test_load_generator_queues_calls_beyond_max_concurrent_streams(
        server_factory: Factory, tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    server = server_factory(tmp_path, "--h2-max-concurrent-streams", "2")
    result = run_grpc_closed_loop(server.grpc_url, [_linear_request("linear")], 16, 0.5,
                                  warmup_s=0.1, channels_per_process=2)
    assert result.errors == {} and result.requests > 10, result.errors


def _linear_request(model: str) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    request.raw_input_contents.append(np.full((1, 8), 0.25, np.float32).tobytes())
    return request.SerializeToString()


def _inferences(server: RunningServer) -> int:
    stats = call(server.url, "GET", "/v2/models/linear/stats").json()["model_stats"]
    return int(stats[0]["inference_count"])


def test_sigterm_finishes_in_flight_grpc_calls(server_factory: Factory, tmp_path: Path) -> None:
    fixture_models.heavy(tmp_path, layers=40, width=512)
    server = server_factory(tmp_path)
    client = triton.InferenceServerClient(server.grpc_url)
    x = triton.InferInput("x", [1, 512], "FP32")
    x.set_data_from_numpy(np.full((1, 512), 0.1, np.float32))
    outcomes: list[str] = []

    def send() -> None:
        try:
            client.infer("heavy", [x])
            outcomes.append("ok")
        except InferenceServerException as exc:
            outcomes.append(str(exc.status()))

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    server.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(timeout=30)
    assert server.process.wait(timeout=30) == 0
    assert "ok" in outcomes
    # a call is either answered or refused before it started (UNAVAILABLE), never lost
    assert all(o in ("ok", "StatusCode.UNAVAILABLE") for o in outcomes), outcomes
