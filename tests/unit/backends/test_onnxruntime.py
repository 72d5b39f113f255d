"""ONNX Runtime: its own errors on bad input values become a client's 400 without node names;
intra-op spinning is chosen from one measured call unless the config decides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from onnx import TensorProto

from serval.backends import onnxruntime as onnxruntime_backend
from serval.backends.base import ModelVersionSpec
from serval.backends.onnxruntime import OnnxRuntimeBackend, rejected_input
from serval.errors import EngineRejectedInput, ErrorCode
from serval.model_config import ModelConfig
from tests import fixture_models

pytestmark = pytest.mark.unit


def test_ort_invalid_argument_becomes_a_400_without_node_names() -> None:
    error = rejected_input(
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Non-zero status code returned while "
        "running Gather node. Name:'/encoder/embed/Gather' Status Message: indices element out "
        "of data bounds, idx=99 must be within the inclusive range [-16,15]")
    assert isinstance(error, EngineRejectedInput) and error.code is ErrorCode.INVALID_INPUT
    assert "(Gather): indices element out of data bounds, idx=99" in error.message
    assert "vocabulary" in error.message and "/encoder" not in error.message
    assert error.detail.startswith("indices element out of data bounds")


def _spinning(model: Any) -> str:
    session = model._free.get()
    model._free.put(session)
    return str(session.get_session_options().get_session_config_entry(
        "session.intra_op.allow_spinning"))


def _load(path: Path, config: str, cores: int = 2) -> Any:
    spec = ModelVersionSpec(path.parent.parent.name, "1", path.parent,
                            ModelConfig.model_validate(yaml.safe_load(config)))
    return OnnxRuntimeBackend(cores).load(spec)


@pytest.mark.parametrize(("threshold_ms", "expected"), [(0.0, "1"), (float("inf"), "0")])
def test_spinning_follows_the_measured_batch1_call(tmp_path: Path, threshold_ms: float,
                                                   expected: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnxruntime_backend, "SPIN_MIN_CALL_MS", threshold_ms)
    path = fixture_models.heavy(tmp_path)
    assert _spinning(_load(path, "max_batch_size: 8\n")) == expected


@pytest.mark.parametrize("setting", [True, False])
def test_a_configured_spinning_is_kept_without_measuring(
        tmp_path: Path, setting: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnxruntime_backend, "batch1_call_ms", _never_called)
    path = fixture_models.heavy(tmp_path)
    config = f"max_batch_size: 8\nonnxruntime: {{allow_spinning: {str(setting).lower()}}}\n"
    assert _spinning(_load(path, config)) == ("1" if setting else "0")


def test_one_thread_never_spins_nor_measures(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnxruntime_backend, "batch1_call_ms", _never_called)
    assert _spinning(_load(fixture_models.heavy(tmp_path), "max_batch_size: 8\n", 1)) == "0"


def test_the_probe_times_a_real_call_and_skips_string_inputs(tmp_path: Path) -> None:
    heavy = _load(fixture_models.heavy(tmp_path), "max_batch_size: 8\n")
    assert onnxruntime_backend.batch1_call_ms(heavy._free.get()) > 0.0
    strings = _load(fixture_models.typed_identity(tmp_path, "s", TensorProto.STRING),
                    "max_batch_size: 8\n")
    assert onnxruntime_backend.batch1_call_ms(strings._free.get()) == 0.0


def _never_called(session: Any) -> float:
    raise AssertionError("the batch-1 call was measured although the setting is decided")


def test_the_configs_session_and_run_settings_reach_the_engine(tmp_path: Path) -> None:
    """What config.pbtxt's optimization and parameters map to (triton_onnxruntime) is what
    the session runs with; the config's own session entries win over Serval's."""
    import numpy as np
    import onnxruntime as ort

    config = ("max_batch_size: 8\nonnxruntime: {graph_optimization_level: disable, "
              "execution_mode: parallel, memory_arena: true, memory_pattern: false, "
              "session_entries: {session.intra_op.allow_spinning: '1'}, "
              "run_entries: {memory.enable_memory_arena_shrinkage: 'cpu:0'}}\n")
    model = _load(fixture_models.linear(tmp_path), config)
    session = model._free.get()
    model._free.put(session)
    options = session.get_session_options()
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert (options.enable_cpu_mem_arena, options.enable_mem_pattern) == (True, False)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert model._run_options.get_run_config_entry(
        "memory.enable_memory_arena_shrinkage") == "cpu:0"
    outputs = model.infer({"x": np.ones((2, 8), np.float32)})
    assert next(iter(outputs.values())).shape[0] == 2


def test_the_memory_arena_may_be_turned_off(tmp_path: Path) -> None:
    model = _load(fixture_models.linear(tmp_path),
                  "max_batch_size: 8\nonnxruntime: {memory_arena: false}\n")
    session = model._free.get()
    assert session.get_session_options().enable_cpu_mem_arena is False


def test_a_string_that_is_not_a_number_is_the_inputs_fault(tmp_path: Path) -> None:
    """A Cast from a string tensor fails with C++'s std::stoll message as a RUNTIME_EXCEPTION
    (every other input fault is INVALID_ARGUMENT): it was a 500 'the model failed'."""
    import numpy as np
    import onnx
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["TEXT"], ["NUMBER"], to=TensorProto.INT64)], "parse",
        [helper.make_tensor_value_info("TEXT", TensorProto.STRING, [-1, 1])],
        [helper.make_tensor_value_info("NUMBER", TensorProto.INT64, [-1, 1])])
    path = tmp_path / "parse" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    model = _load(path, "max_batch_size: 8\n")
    assert model.infer({"TEXT": np.array([[b"42"]], dtype=object)})["NUMBER"].tolist() == [[42]]
    for text in (b"forty-two", b"9" * 30):
        with pytest.raises(EngineRejectedInput, match=r"\(Cast\): a string element is not a "
                                                      r"number it can read") as caught:
            model.infer({"TEXT": np.array([[text]], dtype=object)})
        assert "stoll" not in caught.value.message
