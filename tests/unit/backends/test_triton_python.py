"""Triton Python-backend models loaded in this process (the worker's side): execute() gets
the batch as its requests, errors stay per request, auto-complete, args, finalize."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from serval.backends.base import ModelResponse, ModelVersionSpec, RequestModel, StreamRequest
from serval.backends.python import PythonBackend
from serval.backends.triton_python import TritonModel, defines_triton_model
from serval.errors import BackendError, ConfigError, EngineRejectedInput
from serval.model_config import load_model_config
from serval.protocol.types import InferRequest, RequestedOutput
from tests import triton_python_models as models

pytestmark = pytest.mark.unit


def load(folder: Path) -> TritonModel:
    spec = ModelVersionSpec(folder.name, "1", folder / "1",
                            load_model_config(folder / "config.yaml"))
    model = PythonBackend(allowed=True).load(spec)
    assert isinstance(model, TritonModel) and isinstance(model, RequestModel)
    return model


def test_the_class_is_found_without_running_the_file(tmp_path: Path) -> None:
    folder = models.add_sub(tmp_path)
    assert defines_triton_model(folder / "1" / "model.py")
    (tmp_path / "serval.py").write_text("class Model:\n    pass\n")
    assert not defines_triton_model(tmp_path / "serval.py")
    (tmp_path / "broken.py").write_text("class TritonPythonModel(:\n")
    assert not defines_triton_model(tmp_path / "broken.py")


def test_execute_gets_each_request_of_the_batch_unmerged(tmp_path: Path) -> None:
    model = load(models.add_sub(tmp_path))
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((1, 16), dtype=np.int32)
    results = model.infer_requests([
        InferRequest({"INPUT0": a, "INPUT1": np.ones_like(a)}),
        InferRequest({"INPUT0": b, "INPUT1": b}),
    ])
    assert model._instance.batch_sizes == [2]
    first, second = results
    assert isinstance(first, dict) and isinstance(second, dict)
    np.testing.assert_array_equal(first["OUTPUT0"], a + 1)
    np.testing.assert_array_equal(first["OUTPUT1"], a - 1)
    np.testing.assert_array_equal(second["OUTPUT0"], b * 2)
    assert model.metadata.platform == "python" and model.metadata.max_batch_size == 8
    assert model.metadata.inputs[0].shape == (-1, 16)


def test_an_error_response_fails_only_its_request(tmp_path: Path) -> None:
    model = load(models.write(tmp_path, "checked", models.CHECKED, models.CHECKED_CONFIG))
    good = np.array([[1, 2]], dtype=np.int32)
    results = model.infer_requests([
        InferRequest({"INPUT0": -good}),
        InferRequest({"INPUT0": good}, outputs=[RequestedOutput("SEEN")], id="r7",
                     parameters={"color": "red", "sequence_id": 42, "timeout": 9}),
    ])
    rejected, answered = results
    assert isinstance(rejected, EngineRejectedInput)
    assert rejected.message == "INPUT0 must not be negative"
    assert isinstance(answered, dict)
    np.testing.assert_array_equal(answered["OUTPUT0"], good * 2)
    seen = json.loads(answered["SEEN"][0, 0])
    assert seen == {"id": "r7", "parameters": {"color": "red"}, "correlation_id": 42,
                    "outputs": ["SEEN"]}
    with pytest.raises(EngineRejectedInput, match="negative"):
        model.infer({"INPUT0": -good})


def test_strings_go_in_and_out_as_bytes(tmp_path: Path) -> None:
    model = load(models.write(tmp_path, "simple_string", models.STRING,
                              models.STRING_CONFIG))
    a = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    b = np.array([[b"1"] * 16], dtype=np.object_)
    outputs = model.infer({"INPUT0": a, "INPUT1": b})
    assert outputs["OUTPUT0"].dtype == np.object_
    assert outputs["OUTPUT0"][0].tolist() == [str(i + 1).encode() for i in range(16)]
    assert outputs["OUTPUT1"][0, 0] == b"-1"


def test_auto_complete_fills_the_config_and_initialize_gets_args(tmp_path: Path) -> None:
    folder = models.write(tmp_path, "auto", models.AUTO, models.AUTO_CONFIG)
    model = load(folder)
    assert model.metadata.max_batch_size == 4
    assert [(s.name, s.datatype, s.shape) for s in model.metadata.inputs] == [
        ("IN", "FP32", (-1, 2))]
    assert [s.name for s in model.metadata.outputs] == ["OUT", "ARGS"]
    outputs = model.infer({"IN": np.zeros((1, 2), dtype=np.float32)})
    args = json.loads(outputs["ARGS"][0, 0])
    assert args["model_name"] == "auto" and args["model_version"] == "1"
    assert args["model_repository"] == str(folder)
    assert args["model_instance_kind"] == "CPU"
    config = json.loads(args["model_config"])
    assert config["max_batch_size"] == 4 and config["dynamic_batching"] == {}
    assert config["input"] == [{"name": "IN", "data_type": "TYPE_FP32", "dims": [2]}]
    model.unload()
    model.unload()  # finalize runs once
    assert (folder / "finalized").read_text() == "yes"


class Collected:
    """A sink that keeps what it is sent (backends.base.ResponseSink)."""

    window = 8

    def __init__(self) -> None:
        self.responses: list[ModelResponse] = []
        self.cancelled = False

    def send(self, response: ModelResponse) -> bool:
        self.responses.append(response)
        return not self.cancelled

    def forward(self, response: ModelResponse) -> None:
        self.responses.append(response)

    def relay(self, taken: Callable[[], None], cancelled: Callable[[], None]) -> None:
        pass

    def is_cancelled(self) -> bool:
        return self.cancelled


def test_a_decoupled_model_sends_its_responses_to_each_requests_sink(tmp_path: Path) -> None:
    model = load(models.write(tmp_path, "dec", models.DECOUPLED, models.AUTO_CONFIG))
    assert model.metadata.decoupled
    sinks = [Collected(), Collected()]
    requests = [StreamRequest({"IN": np.array([value], np.float32)}, sink=sink)
                for value, sink in zip((1.0, 5.0), sinks, strict=True)]
    assert model.infer_requests(requests) == [{}, {}]  # execute() returned None
    got = [[(r.outputs["OUT"].tolist() if r.outputs else None, r.final) for r in s.responses]
           for s in sinks]
    assert got == [[([2.0], False), ([3.0], True)], [([10.0], False), ([15.0], True)]]
    with pytest.raises(BackendError, match="need a response stream"):
        model.infer_requests([InferRequest({"IN": np.ones(1, np.float32)})])


def test_a_decoupled_execute_must_return_none(tmp_path: Path) -> None:
    source = models.DECOUPLED.replace("        return None", "        return []")
    model = load(models.write(tmp_path, "dec", source, models.AUTO_CONFIG))
    with pytest.raises(BackendError, match="must return None"):
        model.infer_requests([StreamRequest({"IN": np.ones(1, np.float32)},
                                            sink=Collected())])


def test_a_model_without_inputs_and_outputs_is_refused(tmp_path: Path) -> None:
    source = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
    folder = models.write(tmp_path, "bare", source, models.AUTO_CONFIG)
    with pytest.raises(ConfigError, match="needs its inputs and outputs"):
        load(folder)


def test_failures_in_initialize_and_auto_complete_are_load_errors(tmp_path: Path) -> None:
    source = models.ADD_SUB.replace("self.args = args", "raise RuntimeError('no weights')")
    with pytest.raises(ConfigError, match=r"initialize\(\) failed.*no weights"):
        load(models.write(tmp_path, "init", source, models.ADD_SUB_CONFIG.format(
            datatype="INT32", delay_ms=0)))
    source = models.AUTO.replace('"TYPE_FP32", "dims": [2]})\n        auto_complete_model_config'
                                 '.add_output(', '"TYPE_FP32"})\n        auto_complete_model'
                                 '_config.add_output(', 1)
    with pytest.raises(ConfigError, match=r"auto_complete_config\(\) failed.*'dims'"):
        load(models.write(tmp_path, "auto_bad", source, models.AUTO_CONFIG))


def test_wrong_answers_from_execute_are_backend_errors(tmp_path: Path) -> None:
    source = models.ADD_SUB.replace("(in0 + in1).astype(self.output0_dtype)",
                                    "(in0 + in1).astype('float64')")
    model = load(models.write(tmp_path, "f64", source, models.ADD_SUB_CONFIG.format(
        datatype="INT32", delay_ms=0)))
    x = np.ones((1, 16), dtype=np.int32)
    (result,) = model.infer_requests([InferRequest({"INPUT0": x, "INPUT1": x})])
    assert isinstance(result, BackendError) and "float64, its config says INT32" in result.message
    source = models.ADD_SUB.replace("return responses", "return responses[:-1]")
    model = load(models.write(tmp_path, "short", source, models.ADD_SUB_CONFIG.format(
        datatype="INT32", delay_ms=0)))
    with pytest.raises(BackendError, match="one InferenceResponse per request"):
        model.infer_requests([InferRequest({"INPUT0": x, "INPUT1": x})])


def test_modules_beside_model_py_are_importable_as_in_triton(tmp_path: Path) -> None:
    source = models.ADD_SUB.replace("import numpy as np\n", "import numpy as np\nimport "
                                    "addsub_helper\n").replace("(in0 + in1)",
                                                               "addsub_helper.add(in0, in1)")
    folder = models.write(tmp_path, "helped", source, models.ADD_SUB_CONFIG.format(
        datatype="INT32", delay_ms=0))
    (folder / "1" / "addsub_helper.py").write_text("def add(a, b):\n    return a + b + 100\n")
    x = np.ones((1, 16), dtype=np.int32)
    assert load(folder).infer({"INPUT0": x, "INPUT1": x})["OUTPUT0"][0, 0] == 102


def test_refused_without_the_flag(tmp_path: Path) -> None:
    folder = models.add_sub(tmp_path)
    spec = ModelVersionSpec("add_sub", "1", folder / "1",
                            load_model_config(folder / "config.yaml"))
    with pytest.raises(ConfigError, match="--allow-python-models"):
        PythonBackend(allowed=False).load(spec)
