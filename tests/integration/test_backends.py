"""The pytorch and python backends served for real, through tritonclient."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.conftest import RunningServer
from tests.integration.http_helpers import call, infer

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")

DECLARED = """\
backend: {backend}
max_batch_size: 16
inputs:
  - {{name: x, datatype: FP32, dims: [4]}}
outputs:
  - {{name: y, datatype: FP32, dims: [4]}}
  - {{name: total, datatype: FP32, dims: [1]}}
"""

PYTHON_MODEL = """\
import numpy as np


class Model:
    def load(self, ctx):
        self.scale = float(ctx.version) * 10.0

    def infer(self, inputs):
        x = inputs["x"]
        return {"y": x * self.scale, "total": x.sum(axis=1, keepdims=True)}
"""


class Affine(torch.nn.Module):
    """y = 2x + 1, total = row sums: two outputs to map by declared name."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return 2 * x + 1, x.sum(dim=1, keepdim=True)


def _model_dir(root: Path, name: str, backend: str) -> Path:
    version = root / name / "1"
    version.mkdir(parents=True)
    (root / name / "config.yaml").write_text(DECLARED.format(backend=backend))
    return version


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("backends")
    torch.jit.script(Affine()).save(str(_model_dir(root, "scripted", "pytorch") / "model.pt"))
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(Affine(), (torch.ones(2, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(program, str(_model_dir(root, "exported", "pytorch") / "model.pt2"))
    (_model_dir(root, "pyscale", "python") / "model.py").write_text(PYTHON_MODEL)
    (_model_dir(root, "pybroken", "python") / "model.py").write_text("raise RuntimeError('x')\n")
    return root


@pytest.fixture(scope="module")
def allowed(server_factory: Callable[..., RunningServer], repository: Path) -> RunningServer:
    return server_factory(repository, "--allow-python-models")


def _run(server: RunningServer, model: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    client = triton.InferenceServerClient(server.url)
    infer_input = triton.InferInput("x", list(x.shape), "FP32")
    infer_input.set_data_from_numpy(x)
    result = client.infer(model, [infer_input])
    return result.as_numpy("y"), result.as_numpy("total")


@pytest.mark.parametrize("model", ["scripted", "exported"])
def test_torch_programs_serve_their_declared_outputs(allowed: RunningServer, model: str) -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y, total = _run(allowed, model, x)
    np.testing.assert_allclose(y, 2 * x + 1)
    np.testing.assert_allclose(total, x.sum(axis=1, keepdims=True))
    metadata = call(allowed.url, "GET", f"/v2/models/{model}").json()
    assert metadata["platform"] == "pytorch_libtorch"
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]


def test_python_model_runs_its_class(allowed: RunningServer) -> None:
    x = np.ones((2, 4), dtype=np.float32)
    y, total = _run(allowed, "pyscale", x)
    np.testing.assert_allclose(y, x * 10.0)
    np.testing.assert_allclose(total, [[4.0], [4.0]])


def test_a_broken_python_model_fails_alone(allowed: RunningServer) -> None:
    reply = infer(allowed.url, "pybroken", {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    assert reply.status == 503 and "import failed" in reply.error
    assert _run(allowed, "scripted", np.zeros((1, 4), np.float32))[0].tolist() == [[1] * 4]


def test_python_models_are_refused_without_the_flag(
    server_factory: Callable[..., RunningServer], repository: Path
) -> None:
    server = server_factory(repository)
    client = triton.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match="--allow-python-models"):
        client.infer("pyscale", [_fixed_input()])
    assert client.is_model_ready("scripted")


def _fixed_input() -> triton.InferInput:
    infer_input = triton.InferInput("x", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.ones((1, 4), np.float32))
    return infer_input


PIPELINE = """\
backend: pipeline
max_batch_size: 16
inputs:
  - {name: x, datatype: FP32, dims: [4]}
outputs:
  - {name: scaled, datatype: FP32, dims: [4]}
  - {name: total, datatype: FP32, dims: [1]}
steps:
  - model: scripted
    inputs: {x: x}
    outputs: {y: affine}
  - model: pyscale
    inputs: {x: affine}
    outputs: {y: scaled, total: total}
"""


@pytest.fixture(scope="module")
def with_pipelines(server_factory: Callable[..., RunningServer], repository: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("pipelines")
    for name in ("scripted", "pyscale"):
        shutil.copytree(repository / name, root / name)
    (root / "chain" / "1").mkdir(parents=True)
    (root / "chain" / "config.yaml").write_text(PIPELINE)
    (root / "broken_chain" / "1").mkdir(parents=True)
    (root / "broken_chain" / "config.yaml").write_text(
        PIPELINE.replace("model: pyscale", "model: missing"))
    (root / "miswired" / "1").mkdir(parents=True)
    (root / "miswired" / "config.yaml").write_text(PIPELINE.replace("{x: affine}", "{x: nope}"))
    return server_factory(root, "--allow-python-models")


def test_pipeline_runs_its_steps(with_pipelines: RunningServer) -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    client = triton.InferenceServerClient(with_pipelines.url)
    result = client.infer("chain", [_input(x)])
    np.testing.assert_allclose(result.as_numpy("scaled"), (2 * x + 1) * 10.0)
    np.testing.assert_allclose(result.as_numpy("total"), (2 * x + 1).sum(axis=1, keepdims=True))
    stats = client.get_inference_statistics("scripted")["model_stats"][0]
    assert int(stats["inference_count"]) >= 2  # the step ran on its own model
    chain = client.get_inference_statistics("chain")["model_stats"][0]
    assert [s["step"] for s in chain["pipeline_steps"]] == ["1:scripted", "2:pyscale"]
    assert all(s["count"] >= 1 and s["ns"] > 0 for s in chain["pipeline_steps"])
    metrics = call(with_pipelines.url, "GET", "/metrics").body.decode()
    assert 'serval_pipeline_step_duration_seconds_total{model="chain",step="2:pyscale"' in metrics


def test_pipeline_errors_name_the_pipeline_and_the_log_the_step(
        with_pipelines: RunningServer) -> None:
    reply = infer(with_pipelines.url, "broken_chain", {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
    assert reply.status == 503  # the pipeline exists; a model it needs does not: it did not load
    assert reply.error.startswith("Request for unknown model: 'broken_chain' has no available "
                                  "versions: version 1 is UNAVAILABLE (load failed: step 2 "
                                  "cannot serve: one of its models is not ready")
    assert "missing" not in reply.error and "step 2 ('missing')" in with_pipelines.log()
    miswired = call(with_pipelines.url, "GET", "/v2/models/miswired/ready")
    assert miswired.status == 400
    assert "reads ['nope']" in infer(with_pipelines.url, "miswired", {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}).error
    assert _run(with_pipelines, "scripted", np.zeros((1, 4), np.float32))[0].tolist() == [[1] * 4]


def _input(x: np.ndarray) -> triton.InferInput:
    infer_input = triton.InferInput("x", list(x.shape), "FP32")
    infer_input.set_data_from_numpy(x)
    return infer_input


def test_openvino_matches_onnxruntime_on_the_same_file(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    pytest.importorskip("openvino")
    import onnxruntime as ort

    from tests import fixture_models

    model_file = fixture_models.heavy(tmp_path, name="heavy_ov", layers=4, width=128)
    (tmp_path / "heavy_ov" / "config.yaml").write_text("backend: openvino\nmax_batch_size: 16\n")
    server = server_factory(tmp_path)
    x = np.random.default_rng(3).standard_normal((5, 128)).astype(np.float32)
    client = triton.InferenceServerClient(server.url)
    infer_input = triton.InferInput("x", [5, 128], "FP32")
    infer_input.set_data_from_numpy(x)
    got = client.infer("heavy_ov", [infer_input]).as_numpy("y")
    expected = ort.InferenceSession(str(model_file)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert client.get_model_metadata("heavy_ov")["platform"] == "openvino"
