"""tritonclient's HTTP client against a real server: outputs equal ONNX Runtime's own."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.conftest import RunningServer
from tests.integration.conftest import TYPED_MODELS

pytestmark = pytest.mark.integration

TYPED_ARRAYS = {
    "id_bool": np.array([[True, False, True], [False, False, True]]),
    "id_uint8": np.array([[0, 7, 255], [1, 2, 3]], dtype=np.uint8),
    "id_int8": np.array([[-128, 0, 127], [1, -2, 3]], dtype=np.int8),
    "id_int16": np.array([[-32768, 0, 32767], [1, -2, 3]], dtype=np.int16),
    "id_int32": np.array([[-(2**31), 0, 2**31 - 1], [1, -2, 3]], dtype=np.int32),
    "id_int64": np.array([[-(2**62), 0, 2**62], [1, -2, 3]], dtype=np.int64),
    "id_uint16": np.array([[0, 1, 65535], [4, 5, 6]], dtype=np.uint16),
    "id_uint32": np.array([[0, 1, 2**32 - 1], [4, 5, 6]], dtype=np.uint32),
    "id_uint64": np.array([[0, 1, 2**63], [4, 5, 6]], dtype=np.uint64),
    "id_fp16": np.array([[0.5, -1.25, 65504.0], [1e-3, 2, 3]], dtype=np.float16),
    "id_fp64": np.array([[np.pi, -1e300, 1e-300], [1, 2, 3]], dtype=np.float64),
    "id_bytes": np.array([[b"a", b"", "\u00e9t\u00e9".encode()], [b"x" * 100, b"y", b"z"]],
                         dtype=object),
}


@pytest.fixture(scope="module")
def client(server: RunningServer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.url)


def test_server_and_model_introspection(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add_sub") and not client.is_model_ready("corrupt")
    assert client.get_server_metadata()["name"] == "serval"
    metadata = client.get_model_metadata("add_sub")
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT0", "INPUT1"]
    assert client.get_model_config("add_sub")["max_batch_size"] == 64


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_add_sub_matches_onnxruntime(client: triton.InferenceServerClient,
                                     fixture_repository: Path, binary: bool) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 16)).astype(np.float32)
    b = rng.standard_normal((5, 16)).astype(np.float32)
    inputs = [_input("INPUT0", a, binary), _input("INPUT1", b, binary)]
    outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", inputs, outputs=outputs, request_id="r1")
    session = ort.InferenceSession(str(fixture_repository / "add_sub/1/model.onnx"))
    expected = session.run(None, {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected[0])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), expected[1])
    assert result.get_response()["id"] == "r1"


@pytest.mark.parametrize("model", sorted(TYPED_MODELS))
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_every_datatype_round_trips(client: triton.InferenceServerClient, model: str,
                                    binary: bool) -> None:
    array = TYPED_ARRAYS[model]
    datatype = client.get_model_metadata(model)["inputs"][0]["datatype"]
    infer_input = triton.InferInput("IN", list(array.shape), datatype)
    infer_input.set_data_from_numpy(array, binary_data=binary)
    output = triton.InferRequestedOutput("OUT", binary_data=binary)
    result = client.infer(model, [infer_input], outputs=[output]).as_numpy("OUT")
    if model == "id_bytes":  # JSON BYTES come back as text, as from Triton
        expected = array if binary else np.vectorize(bytes.decode, otypes=[object])(array)
        assert result.tolist() == expected.tolist()
    else:
        assert result.dtype == array.dtype
        np.testing.assert_array_equal(result, array)


def test_statistics_through_tritonclient(client: triton.InferenceServerClient) -> None:
    x = np.ones((4, 8), dtype=np.float32)
    client.infer("linear", [_input("x", x, True)])
    stats = client.get_inference_statistics("linear")["model_stats"][0]
    assert stats["inference_count"] >= 4 and stats["execution_count"] >= 1
    assert int(stats["inference_stats"]["success"]["count"]) >= 1
    assert any(int(b["batch_size"]) == 4 for b in stats["batch_stats"])
    every = client.get_inference_statistics()["model_stats"]
    assert "linear" in {entry["name"] for entry in every}


def test_errors_surface_as_exceptions(client: triton.InferenceServerClient) -> None:
    x = np.ones((1, 8), dtype=np.float32)
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("missing", [_input("x", x, True)])
    with pytest.raises(InferenceServerException, match="shape"):
        client.infer("linear", [_input("x", np.ones((1, 9), np.float32), True)])


def _input(name: str, array: np.ndarray, binary: bool) -> triton.InferInput:
    infer_input = triton.InferInput(name, list(array.shape), "FP32")
    infer_input.set_data_from_numpy(array, binary_data=binary)
    return infer_input
