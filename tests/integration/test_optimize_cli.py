"""`serval optimize` end to end: convert, quantize, verify, publish into a repository that a real
server then serves; a parity failure exits 1 and publishes nothing."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
import torch

from tests import optimize_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import infer

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def _serval(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serval", *args], capture_output=True,
                          text=True, timeout=180, cwd=REPO_ROOT, env=env)


def _manifest(repository: Path, model: str, version: str) -> dict[str, object]:
    doc = orjson.loads((repository / model / version / "manifest.json").read_bytes())
    assert isinstance(doc, dict)
    return doc


def test_optimized_torch_model_is_published_with_its_report_and_served(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    repository = tmp_path / "repo"
    result = _serval("optimize", "tests.optimize_models:tiny_mlp", "--input", "x:float32:16",
                     "--output-name", "probabilities", "--optimize-graph",
                     "--quantize", "int8-dynamic", "--exclude-op", "Softmax",
                     "--out", str(tmp_path / "out"), "--publish", str(repository),
                     "--model", "clf")
    assert result.returncode == 0, result.stderr
    assert "Parity: **PASSED**" in result.stdout and "published clf version 1" in result.stdout
    report = _manifest(repository, "clf", "1")["report"]
    assert isinstance(report, dict)
    assert [s["step"] for s in report["steps"]] == ["convert", "optimize-graph", "quantize"]
    assert report["parity"]["passed"] is True and report["measure"]["after"]["size_bytes"] > 0
    assert report == orjson.loads((tmp_path / "out" / "report.json").read_bytes())
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    server = server_factory(repository)
    reply = infer(server.url, "clf", {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [4, 16], "data": x.ravel().tolist()}]})
    served = np.asarray(reply.json()["outputs"][0]["data"]).reshape(4, 10)
    with torch.no_grad():
        want = optimize_models.tiny_mlp()(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(served.argmax(axis=1), want.argmax(axis=1))
    np.testing.assert_allclose(served.sum(axis=1), 1.0, atol=1e-5)


def test_sklearn_pipeline_publishes_with_label_parity(tmp_path: Path) -> None:
    pickled = optimize_models.sklearn_pipeline(tmp_path / "pipe.pkl")
    repository = tmp_path / "repo"
    result = _serval("optimize", str(pickled), "--out", str(tmp_path / "out"), "--no-measure",
                     "--parity-items", "400", "--publish", str(repository), "--model", "skl")
    assert result.returncode == 0, result.stderr
    parity = _manifest(repository, "skl", "1")["report"]["parity"]  # type: ignore[index]
    figures = {o["name"]: o for o in parity["outputs"]}
    assert figures["label"]["top1_agreement"] == 1.0 and figures["label"]["items"] == 400
    assert figures["probabilities"]["max_abs_error"] < 1e-5
    assert pickle.loads(pickled.read_bytes()).n_features_in_ == 6


def test_a_parity_failure_exits_1_and_publishes_nothing(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    result = _serval("optimize", "tests.optimize_models:outlier_mlp", "--input", "x:float32:16",
                     "--quantize", "int8-dynamic", "--no-measure", "--out", str(tmp_path / "out"),
                     "--publish", str(repository), "--model", "clf")
    assert result.returncode == 1
    assert result.stderr.strip().startswith("serval: parity failed, nothing published: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (repository / "clf").exists()
    report = orjson.loads((tmp_path / "out" / "report.json").read_bytes())
    assert report["parity"]["passed"] is False
    assert any("top-1 agreement" in f for f in report["parity"]["failures"])
    assert "Parity: **FAILED**" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize(("args", "reason"), [
    (["tests.optimize_models:tiny_mlp", "--input", "x:float33:16"], "--input 'x:float33:16'"),
    (["tests.optimize_models:tiny_mlp"], "needs its inputs declared"),
    (["tests.optimize_models:tiny_mlp", "--input", "x:float32:16", "--quantize", "int4"],
     "--quantize 'int4': expected one of int8-auto, int8-dynamic, int8-static, fp16"),
    (["model.onnx", "--publish", "repo"], "--publish needs --model NAME"),
    (["tests.optimize_models:tiny_mlp", "--input", "x:float32:16", "--quantize", "int8-dynamic",
      "--smooth", "1.5"], "--smooth 1.5: expected a number between 0 and 1"),
    (["tests.optimize_models:tiny_mlp", "--input", "x:float32:16", "--quantize", "fp16",
      "--smooth", "0.7"], "--smooth applies to INT8: add --quantize int8-auto"),
    (["tests.optimize_models:tiny_mlp", "--input", "x:float32:16", "--quantize", "int8-dynamic",
      "--smooth", "0.7"], "--smooth needs calibration data"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, args: list[str], reason: str) -> None:
    result = _serval("optimize", *args, "--out", str(tmp_path / "out"), "--no-measure")
    assert result.returncode == 2
    assert reason in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_missing_library_names_the_extra_to_install(tmp_path: Path) -> None:
    blocked = tmp_path / "blocked" / "skl2onnx"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(blocked.parent)}
    pickled = optimize_models.sklearn_pipeline(tmp_path / "pipe.pkl")
    result = _serval("optimize", str(pickled), "--out", str(tmp_path / "out"), env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == ("serval: this step needs skl2onnx, which is not installed: "
                                     "pip install 'serval-server[optimize]'")


@pytest.mark.parametrize(("content", "reason"), [
    (bytes(range(256)) * 20, "not a valid ONNX model: Protobuf parsing failed."),
    (b"", "not a valid ONNX model: No graph was found in the protobuf."),
])
def test_a_file_that_is_no_onnx_model_is_one_line_and_writes_nothing(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    source = tmp_path / "bad.onnx"
    source.write_bytes(content)
    result = _serval("optimize", str(source), "--out", str(tmp_path / "out"), "--no-measure")
    assert result.returncode == 2
    assert result.stderr.strip() == f"serval: {source}: {reason}"
    assert not (tmp_path / "out").exists()
