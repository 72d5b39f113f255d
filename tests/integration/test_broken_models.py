"""Broken model folders beside a good one: the server starts, the good model serves, and each
broken one is reported precisely (index UNAVAILABLE with its reason, load 400 naming the
problem, one log line without a traceback), never a 500, a traceback or a server path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import tritonclient.grpc as triton_grpc

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call

pytestmark = pytest.mark.integration

Factory = Callable[..., RunningServer]

# model name -> words its reason (index, load) must hold
BROKEN = {
    "not_utf8_yaml": "not UTF-8 text",
    "yaml_folder": "is a folder",
    "pbtxt_folder": "is a folder",
    "label_folder": "is a folder",
    "label_not_utf8": "not UTF-8 text",
    "policy_none": "the version policy selects no version folder",
    "threads": "1024",
    "huge_batch": "max_batch_size",
    "huge_batch_e23": "max_batch_size",
    "superscript": "no version folder",
    "pipeline_wrong_step": "maps input 'nosuch', which model 'good' does not have (its inputs",
}


def _repository(root: Path) -> None:
    model = fixture_models.linear(root, name="good")
    for name in BROKEN:
        fixture_models.linear(root, name=name)
    (root / "not_utf8_yaml" / "config.yaml").write_bytes(b"max_batch_size: 8\n# \xff\xfe\n")
    (root / "yaml_folder" / "config.yaml").unlink()
    (root / "yaml_folder" / "config.yaml").mkdir()
    (root / "pbtxt_folder" / "config.pbtxt").mkdir()
    for name, labels in (("label_folder", None), ("label_not_utf8", b"cat\n\xffdog\n")):
        (root / name / "config.yaml").unlink()
        (root / name / "config.pbtxt").write_text(
            'backend: "onnxruntime"\nmax_batch_size: 8\n'
            'output [{ name: "probabilities", data_type: TYPE_FP32, dims: [4], '
            'label_filename: "labels.txt" }]\n')
        if labels is None:
            (root / name / "labels.txt").mkdir()
        else:
            (root / name / "labels.txt").write_bytes(labels)
    (root / "policy_none" / "config.yaml").write_text("version_policy:\n  specific: [7]\n")
    (root / "threads" / "config.yaml").write_text("onnxruntime:\n  intra_op_threads: 100000\n")
    (root / "huge_batch" / "config.yaml").write_text("max_batch_size: 3000000000\n")
    (root / "huge_batch_e23" / "config.yaml").write_text(
        "max_batch_size: 99999999999999999999999\n")
    (root / "superscript" / "1").rename(root / "superscript" / "²")
    (root / "pipeline_wrong_step" / "1" / "model.onnx").unlink()
    (root / "pipeline_wrong_step" / "config.yaml").write_text(
        "backend: pipeline\ninputs:\n- {name: x, datatype: FP32, dims: [8]}\noutputs:\n"
        "- {name: y, datatype: FP32, dims: [4]}\nsteps:\n- model: good\n"
        "  inputs: {nosuch: x}\n  outputs: {probabilities: y}\n")
    # a version folder of Arabic-Indic digits is no version: the model serves 1/ only
    shutil.copytree(model.parent, root / "good" / "٣")
    # a model folder whose name is not UTF-8 is skipped (one warning)
    shutil.copytree(model.parent.parent, os.fsdecode(bytes(root) + b"/bad\xff"))


def test_broken_models_are_reported_and_the_good_one_serves(server_factory: Factory,
                                                              tmp_path: Path) -> None:
    _repository(tmp_path)
    server = server_factory(tmp_path, "--repository-api")

    index = call(server.url, "POST", "/v2/repository/index")
    assert index.status == 200
    entries = {entry["name"]: entry for entry in index.json()}
    assert entries["good"]["state"] == "READY" and entries["good"]["version"] == "1"
    assert not any("bad" in name for name in entries)  # the non-UTF-8 folder is skipped
    for name, words in BROKEN.items():
        assert entries[name]["state"] == "UNAVAILABLE", name
        assert words in entries[name]["reason"], (name, entries[name]["reason"])
        assert str(tmp_path) not in entries[name]["reason"]
    assert call(server.url, "GET", "/v2/models/good/versions/3").status == 404

    for name, words in BROKEN.items():
        reply = call(server.url, "POST", f"/v2/repository/models/{name}/load")
        assert reply.status == 400, (name, reply.body)
        assert words in reply.error and str(tmp_path) not in reply.error, (name, reply.error)
    reply = call(server.url, "POST", "/v2/models/policy_none/infer",
                 b'{"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", '
                 b'"data": [0, 0, 0, 0, 0, 0, 0, 0]}]}')
    assert "the version policy selects no version folder" in reply.error

    for path in ("/metrics", "/v2/models/stats"):
        assert call(server.url, "GET", path).status == 200, path
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    assert {m.name for m in client.get_model_repository_index().models} >= set(BROKEN)
    assert client.get_model_config("good").config.max_batch_size == 32
    log = server.log()
    assert "Traceback" not in log and "Logging error" not in log
    assert log.count("not valid UTF-8") == 1 and r"bad\\xff" in log  # JSON-escaped


def test_models_list_reports_each_broken_model(tmp_path: Path) -> None:
    _repository(tmp_path)
    result = subprocess.run([sys.executable, "-m", "serval", "models", "list", "-r",
                             str(tmp_path), "--format", "json"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    rows = {row["model"]: row for row in json.loads(result.stdout)}
    assert rows["good"]["versions"] == ["1"] and rows["good"]["status"] == "ok"
    for name in ("not_utf8_yaml", "yaml_folder", "pbtxt_folder", "label_folder",
                 "label_not_utf8", "threads", "huge_batch", "huge_batch_e23"):
        assert rows[name]["status"].startswith("invalid: "), name
        assert BROKEN[name] in rows[name]["status"], (name, rows[name]["status"])
    assert rows["superscript"]["status"] == "no version folder"
    assert not any("bad" in name for name in rows)
