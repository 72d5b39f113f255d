"""The CUDA execution provider path: runs only where onnxruntime sees a GPU."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call, infer

pytestmark = [pytest.mark.integration, pytest.mark.gpu]


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                    reason="no CUDA execution provider on this machine")
def test_model_on_cuda_matches_cpu(server_factory: Callable[..., RunningServer],
                                   tmp_path: Path) -> None:
    model_file = fixture_models.heavy(tmp_path)
    (tmp_path / "heavy" / "config.yaml").write_text("max_batch_size: 128\ndevice: cuda\n")
    server = server_factory(tmp_path)
    assert call(server.url, "GET", "/v2/models/heavy/ready").status == 200
    x = np.random.default_rng(2).standard_normal((4, 384)).astype(np.float32)
    reply = infer(server.url, "heavy", {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [4, 384], "data": x.ravel().tolist()}]})
    assert reply.status == 200, reply.body
    got = np.asarray(reply.json()["outputs"][0]["data"], dtype=np.float32).reshape(4, 384)
    expected = ort.InferenceSession(str(model_file)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4)



def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not _torch_cuda(), reason="torch sees no CUDA device")
def test_torch_backend_fp16_on_cuda(server_factory: Callable[..., RunningServer],
                                    tmp_path: Path) -> None:
    import torch

    version = tmp_path / "half" / "1"
    version.mkdir(parents=True)
    torch.jit.script(torch.nn.Linear(8, 4)).save(str(version / "model.pt"))
    (tmp_path / "half" / "config.yaml").write_text(
        "backend: pytorch\nmax_batch_size: 8\ndevice: cuda\nprecision: fp16\n"
        "inputs: [{name: x, datatype: FP32, dims: [8]}]\n"
        "outputs: [{name: y, datatype: FP32, dims: [4]}]\n")
    server = server_factory(tmp_path)
    reply = infer(server.url, "half", {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [2, 8], "data": [0.5] * 16}]})
    assert reply.status == 200, reply.body
    assert reply.json()["outputs"][0]["shape"] == [2, 4]
