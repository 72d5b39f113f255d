"""Triton's business logic scripting on a real server: Python models run other models of the
server (`InferenceRequest(...).exec()`, `async_exec()` from an `async def execute`, from a
decoupled model too), asked with tritonclient over HTTP and gRPC; a failed call reaches the
model as an error response, and the called model counts the call like a client's request."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import triton_bls_models
from tests.conftest import RunningServer
from tests.integration.stream_helpers import stream_responses

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bls_server(server_factory: Callable[..., RunningServer],
               tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = triton_bls_models.build(tmp_path_factory.mktemp("bls-repository"))
    return server_factory(root, "--allow-python-models")


def _client(server: RunningServer, transport: str) -> Any:
    if transport == "http":
        return httpclient.InferenceServerClient(server.url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _inputs(module: Any, a: np.ndarray, b: np.ndarray, target: str | None = None) -> list[Any]:
    inputs = [module.InferInput("INPUT0", list(a.shape), "FP32"),
              module.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    if target is not None:
        name = module.InferInput("MODEL_NAME", [a.shape[0], 1], "BYTES")
        name.set_data_from_numpy(np.array([[target.encode()]] * a.shape[0], dtype=np.object_))
        inputs.append(name)
    return inputs


def _pair(rows: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rows)
    return (rng.random((rows, 16), dtype=np.float32), rng.random((rows, 16), dtype=np.float32))


def _successes(server: RunningServer, model: str) -> int:
    stats = httpclient.InferenceServerClient(server.url).get_inference_statistics(model)
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("target", ["add_sub", "add_sub_onnx"])
def test_a_python_model_runs_the_model_it_names(bls_server: RunningServer, transport: str,
                                                target: str) -> None:
    module = httpclient if transport == "http" else grpcclient
    a, b = _pair()
    before = _successes(bls_server, target)
    result = _client(bls_server, transport).infer("bls_sync", _inputs(module, a, b, target))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    assert _successes(bls_server, target) == before + 1  # counted like a client's request


@pytest.mark.parametrize(("target", "says"), [
    ("undefined_model", "Request for unknown model: 'undefined_model' is not found"),
    ("bls_sync", "model 'bls_sync' cannot run inference on itself"),
    ("square_int32", r"model 'square_int32' is decoupled \(0..n responses per request\): "
                     r"call it with exec\(decoupled=True\)"),
])
def test_a_failed_call_is_an_error_response_the_model_passes_on(
        bls_server: RunningServer, target: str, says: str) -> None:
    a, b = _pair()
    with pytest.raises(InferenceServerException, match=says) as refused:
        _client(bls_server, "http").infer("bls_sync", _inputs(httpclient, a, b, target))
    assert refused.value.status() == "400"
    result = _client(bls_server, "http").infer("bls_sync", _inputs(httpclient, a, b, "add_sub"))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)  # it goes on


def test_async_execute_awaits_calls_made_together(bls_server: RunningServer) -> None:
    a, b = _pair(3)
    onnx_before = _successes(bls_server, "add_sub_onnx")
    python_before = _successes(bls_server, "add_sub")
    result = _client(bls_server, "grpc").infer("bls_async", _inputs(grpcclient, a, b))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
    assert _successes(bls_server, "add_sub_onnx") == onnx_before + 1
    assert _successes(bls_server, "add_sub") == python_before + 1


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_calls_gathered_together_run_together(bls_server: RunningServer, transport: str) -> None:
    """Four async_exec() calls gathered reach the called model at once, so its batcher puts
    them in one batch of 4 (one at a time, each would be a batch of 1 after 5 s)."""
    module = httpclient if transport == "http" else grpcclient
    a, b = _pair()
    result = _client(bls_server, transport).infer("bls_fanout", _inputs(module, a, b))
    assert result.as_numpy("OUTPUT0").tolist() == [[4.0] * 16]


def _square(server: RunningServer, transport: str, model: str, n: int) -> tuple[int, int]:
    module = httpclient if transport == "http" else grpcclient
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([n], np.int32))
    result = _client(server, transport).infer(model, [tensor])
    return int(result.as_numpy("SUM")[0]), int(result.as_numpy("COUNT")[0])


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_a_streamed_call_iterates_a_decoupled_models_responses(bls_server: RunningServer,
                                                                 transport: str) -> None:
    """exec(decoupled=True) on square_int32: n responses, then the final one without
    outputs (n + 1 in all, as Triton); gathered async_exec(decoupled=True) calls too."""
    assert _square(bls_server, transport, "bls_square_sum", 4) == (16, 5)
    assert _square(bls_server, transport, "bls_square_sum", 0) == (0, 1)
    assert _square(bls_server, transport, "bls_square_sum_async", 3) == (18, 8)


def test_a_cancelled_streamed_call_ends_with_a_cancelled_error(bls_server: RunningServer
                                                                ) -> None:
    cancelled, seen = _square(bls_server, "grpc", "bls_square_cancel", 100_000)
    assert cancelled == 1 and 1 <= seen < 100_000
    assert _square(bls_server, "http", "bls_square_sum", 2) == (4, 3)  # the model goes on


def test_a_streamed_call_to_a_model_that_is_not_decoupled_gets_one_response(
        bls_server: RunningServer) -> None:
    a, b = _pair()
    result = _client(bls_server, "http").infer("bls_stream_plain", _inputs(httpclient, a, b))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)


def test_concurrent_clients_each_get_their_own_answer(bls_server: RunningServer) -> None:
    """Batches of bls_sync, each request calling out on its own: nothing is mixed up."""
    errors: list[BaseException] = []

    def client(seed: int) -> None:
        try:
            http = _client(bls_server, "http")
            for round_index in range(5):
                a = np.full((1, 16), float(seed * 100 + round_index), np.float32)
                b = np.arange(16, dtype=np.float32).reshape(1, 16)
                target = ("add_sub", "add_sub_onnx")[(seed + round_index) % 2]
                result = http.infer("bls_sync", _inputs(httpclient, a, b, target))
                np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors[0]


def test_a_decoupled_model_calls_out_and_streams(bls_server: RunningServer) -> None:
    a, b = _pair(2)
    answers = stream_responses(bls_server.grpc_url, "bls_decoupled",
                               _inputs(grpcclient, a, b), 2)
    np.testing.assert_allclose(answers[0].as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(answers[1].as_numpy("OUTPUT0"), (a + b) * 2, rtol=1e-6)


def test_a_model_calling_out_unloads_and_the_server_goes_on(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    server = server_factory(triton_bls_models.build(tmp_path), "--allow-python-models",
                            "--model-control", "explicit", "--load-model", "*")
    client = _client(server, "grpc")
    a, b = _pair()
    client.infer("bls_sync", _inputs(grpcclient, a, b, "add_sub_onnx"))
    client.unload_model("bls_sync")
    assert not client.is_model_ready("bls_sync")
    client.load_model("bls_sync")
    result = client.infer("bls_sync", _inputs(grpcclient, a, b, "add_sub"))
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)
