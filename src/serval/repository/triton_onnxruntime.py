"""config.pbtxt's ONNX Runtime settings as Serval's `onnxruntime` section (pure functions), as
Triton's ONNX Runtime backend reads them:
- `optimization.graph.level`: -1 basic, 1 extended, 2 none; anything else all (the default);
- `optimization.execution_accelerators`: `openvino` on the CPU; on a GPU instance `tensorrt`
  (its parameters mapped to the TensorRT provider's options) and `cuda`, then CUDA; a GPU
  accelerator on a CPU instance is ignored (as Triton, which applies them to GPU instances);
- `optimization.input_pinned_memory` / `output_pinned_memory`: accepted, nothing to do (Serval
  stages no host copies of its own);
- model `parameters`: intra_op_thread_count, inter_op_thread_count (0: the default),
  execution_mode (0 sequential, 1 parallel), enable_mem_arena, enable_mem_pattern,
  session.use_device_allocator_for_initializers (a session entry),
  memory.enable_memory_arena_shrinkage (a run entry).
A value Serval cannot honour is a ConfigError naming it, in Triton's words where it has some."""

from __future__ import annotations

import logging
from typing import Any

from serval.errors import ConfigError
from serval.model_config import MAX_THREADS
from serval.protocol.grpc import model_config_pb2 as mc

log = logging.getLogger(__name__)

_ACCELERATOR = {"name": None, "parameters": None}
# The fields of `optimization` Serval honours (triton_config.SUPPORTED nests this).
OPTIMIZATION_SUPPORTED: dict[str, Any] = {
    "graph": {"level": None},
    "execution_accelerators": {"cpu_execution_accelerator": _ACCELERATOR,
                               "gpu_execution_accelerator": _ACCELERATOR},
    "input_pinned_memory": {"enable": None},
    "output_pinned_memory": {"enable": None},
}
_GRAPH_LEVELS = {-1: "basic", 1: "extended", 2: "disable"}
_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")
# TensorRT accelerator parameters Triton renames; every other one it takes is named trt_*.
_TENSORRT_RENAMED = {"max_workspace_size_bytes": "trt_max_workspace_size",
                     "int8_calibration_table_name": "trt_int8_calibration_table_name",
                     "int8_use_native_calibration_table":
                         "trt_int8_use_native_calibration_table"}
_PRECISIONS = {"FP32": {}, "FP16": {"trt_fp16_enable": "1"}, "INT8": {"trt_int8_enable": "1"}}


def onnxruntime_settings(config: mc.ModelConfig, device: str, source: str) -> dict[str, Any]:
    """The `onnxruntime` settings of an ONNX model's config.pbtxt on `device`."""
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    settings: dict[str, Any] = {}
    if config.optimization.HasField("graph"):
        settings["graph_optimization_level"] = _GRAPH_LEVELS.get(
            config.optimization.graph.level, "all")
    for key, name in (("intra_op_thread_count", "intra_op_threads"),
                      ("inter_op_thread_count", "inter_op_threads")):
        count = _integer(parameters, key, source)
        if count > MAX_THREADS:
            raise ConfigError(f"{source}: parameter '{key}': {count} threads is more than "
                              f"{MAX_THREADS}, the most Serval starts for one model (the same "
                              "bound on every machine)")
        if count > 0:
            settings[name] = count
    mode = _integer(parameters, "execution_mode", source)
    if mode not in (0, 1):
        raise ConfigError(f"{source}: parameter 'execution_mode': expected 0 (sequential) or "
                          f"1 (parallel), got {mode}")
    settings["execution_mode"] = ("sequential", "parallel")[mode]
    for key, name in (("enable_mem_arena", "memory_arena"),
                      ("enable_mem_pattern", "memory_pattern")):
        if key in parameters:
            settings[name] = _boolean(parameters[key], f"parameter '{key}'", source)
    entry = "session.use_device_allocator_for_initializers"
    if entry in parameters:
        settings["session_entries"] = {entry: parameters[entry]}
    entry = "memory.enable_memory_arena_shrinkage"
    if entry in parameters:
        settings["run_entries"] = {entry: parameters[entry]}
    providers = _providers(config.optimization.execution_accelerators, device, source)
    if providers:
        settings["execution_providers"] = providers
    return settings


def _providers(accelerators: mc.ModelOptimizationPolicy.ExecutionAccelerators, device: str,
               source: str) -> list[Any]:
    where = "field 'optimization.execution_accelerators"
    providers: list[Any] = []
    if device.startswith("cuda") and accelerators.gpu_execution_accelerator:
        device_id = {"device_id": device.partition(":")[2] or "0"}
        cuda = dict(device_id)
        tensorrt: dict[str, str] | None = None
        for accelerator in accelerators.gpu_execution_accelerator:
            parameters = dict(accelerator.parameters)
            if accelerator.name == "tensorrt":
                tensorrt = {**device_id, **_tensorrt(parameters, where, source)}
            elif accelerator.name == "cuda":
                cuda.update(parameters)
            else:
                raise ConfigError(f"{source}: {where}.gpu_execution_accelerator': unknown "
                                  f"Execution Accelerator '{accelerator.name}' (ONNX Runtime "
                                  "takes tensorrt or cuda)")
        if tensorrt is not None:
            providers.append(("TensorrtExecutionProvider", tensorrt))
        providers.append(("CUDAExecutionProvider", cuda))  # TensorRT's fallback, as Triton
    elif accelerators.gpu_execution_accelerator and not device.startswith("cuda"):
        log.warning("%s: gpu_execution_accelerator ignored: the model's instances run on the "
                    "CPU (instance_group kind KIND_GPU puts them on a GPU)", source)
    for accelerator in accelerators.cpu_execution_accelerator:
        if accelerator.name != "openvino" or accelerator.parameters:
            raise ConfigError(f"{source}: {where}.cpu_execution_accelerator': unknown "
                              f"Execution Accelerator '{accelerator.name}'"
                              f"{' with parameters' if accelerator.parameters else ''} (ONNX "
                              "Runtime takes openvino, without parameters)")
        providers.append(("OpenVINOExecutionProvider", {"device_type": "CPU"}))
    return [*providers, "CPUExecutionProvider"] if providers else []


def _tensorrt(parameters: dict[str, str], where: str, source: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for key, value in parameters.items():
        if key == "precision_mode":
            if value not in _PRECISIONS:
                raise ConfigError(f"{source}: {where}' tensorrt: precision_mode '{value}': "
                                  f"expected {', '.join(_PRECISIONS)}")
            options.update(_PRECISIONS[value])
        elif key in _TENSORRT_RENAMED or key.startswith("trt_"):
            options[_TENSORRT_RENAMED.get(key, key)] = value
        else:
            raise ConfigError(f"{source}: {where}' tensorrt: unknown parameter '{key}' is "
                              "provided for TensorRT Execution Accelerator")
    return options


def _integer(parameters: dict[str, str], key: str, source: str) -> int:
    value = parameters.get(key, "0")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{source}: parameter '{key}': expected an integer, got "
                          f"{value!r}") from None


def _boolean(value: str, where: str, source: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ConfigError(f"{source}: {where}: expected true or false (1 or 0), got {value!r}")
