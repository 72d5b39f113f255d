"""config.pbtxt's ONNX Runtime settings as Triton's ONNX Runtime backend reads them: graph
optimization levels, the backend's model parameters, execution accelerators per device, and
what cannot be honoured named in one error."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from google.protobuf import text_format

from serval.errors import ConfigError
from serval.protocol.grpc import model_config_pb2 as mc
from serval.repository.layout import scan_model
from serval.repository.triton_onnxruntime import onnxruntime_settings

pytestmark = pytest.mark.unit


def _settings(text: str, device: str = "cpu") -> dict[str, object]:
    return onnxruntime_settings(text_format.Parse(text, mc.ModelConfig()), device, "cfg")


def _parameters(**values: str) -> str:
    return " ".join(f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
                    for key, value in values.items())


@pytest.mark.parametrize(("level", "expected"), [
    (-1, "basic"), (1, "extended"), (2, "disable"), (0, "all"), (7, "all")])
def test_graph_levels_are_tritons(level: int, expected: str) -> None:
    settings = _settings(f"optimization {{ graph {{ level: {level} }} }}")
    assert settings["graph_optimization_level"] == expected
    assert "graph_optimization_level" not in _settings("")  # unset: Serval's default (all)


def test_the_backends_parameters_become_session_and_run_settings() -> None:
    settings = _settings(_parameters(
        intra_op_thread_count="3", inter_op_thread_count="2", execution_mode="1",
        enable_mem_arena="0", enable_mem_pattern="true",
        **{"session.use_device_allocator_for_initializers": "1",
           "memory.enable_memory_arena_shrinkage": "cpu:0"}))
    assert settings == {
        "intra_op_threads": 3, "inter_op_threads": 2, "execution_mode": "parallel",
        "memory_arena": False, "memory_pattern": True,
        "session_entries": {"session.use_device_allocator_for_initializers": "1"},
        "run_entries": {"memory.enable_memory_arena_shrinkage": "cpu:0"}}
    zero = _settings(_parameters(intra_op_thread_count="0"))  # 0: the default, as Triton
    assert zero == {"execution_mode": "sequential"}


@pytest.mark.parametrize(("text", "named"), [
    (_parameters(execution_mode="2"), "parameter 'execution_mode': expected 0 (sequential)"),
    (_parameters(intra_op_thread_count="many"), "parameter 'intra_op_thread_count': expected"),
    (_parameters(enable_mem_arena="maybe"), "parameter 'enable_mem_arena': expected true"),
    ('optimization { execution_accelerators { cpu_execution_accelerator [ { name: "mkl" } ] '
     "} }", "unknown Execution Accelerator 'mkl'"),
    ('optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" '
     'parameters { key: "device_type" value: "GPU" } } ] } }', "without parameters"),
])
def test_what_cannot_be_honoured_is_named(text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=r"^cfg: ") as refused:
        _settings(text)
    assert named in str(refused.value)


def test_openvino_runs_ahead_of_the_cpu_provider() -> None:
    settings = _settings('optimization { execution_accelerators { cpu_execution_accelerator '
                         '[ { name: "openvino" } ] } }')
    assert settings["execution_providers"] == [
        ("OpenVINOExecutionProvider", {"device_type": "CPU"}), "CPUExecutionProvider"]


GPU = ('optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" '
       'parameters { key: "precision_mode" value: "FP16" } '
       'parameters { key: "max_workspace_size_bytes" value: "1073741824" } '
       'parameters { key: "trt_engine_cache_enable" value: "1" } }, '
       '{ name: "cuda" parameters { key: "cudnn_conv_use_max_workspace" value: "0" } } ] } }')


def test_gpu_accelerators_apply_to_gpu_instances(caplog: pytest.LogCaptureFixture) -> None:
    assert _settings(GPU, "cuda:1")["execution_providers"] == [
        ("TensorrtExecutionProvider", {"device_id": "1", "trt_fp16_enable": "1",
                                       "trt_max_workspace_size": "1073741824",
                                       "trt_engine_cache_enable": "1"}),
        ("CUDAExecutionProvider", {"device_id": "1", "cudnn_conv_use_max_workspace": "0"}),
        "CPUExecutionProvider"]
    with caplog.at_level(logging.WARNING):
        assert "execution_providers" not in _settings(GPU, "cpu")  # as Triton: ignored
    assert "gpu_execution_accelerator ignored" in caplog.text


@pytest.mark.parametrize(("accelerator", "named"), [
    ('{ name: "tensorrt" parameters { key: "precision_mode" value: "FP8" } }',
     "precision_mode 'FP8'"),
    ('{ name: "tensorrt" parameters { key: "fast" value: "1" } }',
     "unknown parameter 'fast' is provided for TensorRT"),
    ('{ name: "auto_mixed_precision" }', "unknown Execution Accelerator 'auto_mixed_precision'"),
])
def test_gpu_accelerators_that_cannot_be_honoured_are_named(accelerator: str,
                                                            named: str) -> None:
    text = ("optimization { execution_accelerators { gpu_execution_accelerator "
            f"[ {accelerator} ] }} }}")
    with pytest.raises(ConfigError, match=r"^cfg: ") as refused:
        _settings(text, "cuda")
    assert named in str(refused.value)


def test_a_config_pbtxt_carries_them_into_the_models_config(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text(
        'platform: "onnxruntime_onnx" optimization { graph { level: 2 } } '
        + _parameters(intra_op_thread_count="1"))
    directory = scan_model(tmp_path, "m")
    assert directory is not None
    config = directory.config()
    assert config.onnxruntime.graph_optimization_level == "disable"
    assert config.onnxruntime.intra_op_threads == 1
    (tmp_path / "m" / "config.pbtxt").write_text(
        'backend: "python" optimization { graph { level: 2 } }')
    with pytest.raises(ConfigError, match="'optimization' is supported for ONNX Runtime"):
        directory.config()


@pytest.mark.parametrize("key", ["intra_op_thread_count", "inter_op_thread_count"])
def test_thread_counts_beyond_the_bound_are_refused_naming_the_parameter(key: str) -> None:
    assert _settings(_parameters(**{key: "1024"}))  # the bound itself is allowed
    with pytest.raises(ConfigError, match=f"parameter '{key}': 100000 threads is more than 1024"):
        _settings(_parameters(**{key: "100000"}))
