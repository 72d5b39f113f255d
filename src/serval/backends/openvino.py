"""The OpenVINO engine (CPU plugin): ONNX or IR (`model.xml` + `.bin`) files.

openvino is an optional extra, imported only when such a model loads. Each engine instance
owns an infer request; inputs and outputs are read from the model.
"""

from __future__ import annotations

import queue
from dataclasses import replace
from pathlib import Path
from typing import Any

from serval.backends.base import (
    BackendOptions,
    LoadedModel,
    ModelMetadata,
    ModelVersionSpec,
    SameDim,
    resolve_max_batch_size,
)
from serval.backends.engine import EngineBackend
from serval.backends.onnxruntime import SESSION_OVERHEAD_BYTES, SMALL_MODEL_BYTES
from serval.backends.validation import same_dims
from serval.errors import ConfigError
from serval.protocol.dtypes import from_openvino_type
from serval.protocol.types import TensorDict, TensorSpec

MODEL_FILES = ("model.xml", "model.onnx")


class OpenVinoBackend(EngineBackend):
    """Compiles models for the CPU plugin with threads sized like the ONNX Runtime backend."""

    name = "openvino"

    def __init__(self, cores: int) -> None:
        self.cores = max(1, cores)
        self._core: Any = None

    @classmethod
    def from_options(cls, options: BackendOptions) -> OpenVinoBackend:
        return cls(options.cores)

    def load(self, spec: ModelVersionSpec) -> LoadedModel:
        ov = _import_openvino()
        if self._core is None:
            self._core = ov.Core()
        path = _model_file(spec.path)
        if spec.config.device != "cpu":
            raise ConfigError(
                f"backend 'openvino' serves on the CPU; device is {spec.config.device}")
        try:
            model = self._core.read_model(str(path))
        except Exception as exc:
            raise ConfigError(f"{path}: OpenVINO cannot read it: {exc}") from None
        small = path.stat().st_size < SMALL_MODEL_BYTES
        threads = 1 if small else max(1, self.cores // spec.config.instances)
        compiled = self._core.compile_model(model, "CPU", {
            "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
            # the model's own precision: OpenVINO 2026 computes in reduced precision on some
            # CPUs by default (answers off by ~1e-2 from ONNX Runtime on the same file)
            "INFERENCE_PRECISION_HINT": "f32"})
        # names from the model as read: compiling may rename an output (keeping an alias)
        metadata = _metadata(model, spec.config.max_batch_size, str(path))
        metadata = replace(metadata, same_dims=_named_dims(path, metadata.max_batch_size > 0))
        size = (_file_bytes(path) + SESSION_OVERHEAD_BYTES) * spec.config.instances
        return OpenVinoModel(compiled, metadata, spec.config.instances, size)


class OpenVinoModel:
    """One infer request per instance; each concurrent run takes a free one."""

    def __init__(self, compiled: Any, metadata: ModelMetadata, instances: int,
                 size_bytes: int) -> None:
        self._metadata, self._size_bytes = metadata, size_bytes
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(instances):
            self._free.put(compiled.create_infer_request())
        self._outputs = [(spec.name, port) for spec, port in
                         zip(metadata.outputs, compiled.outputs, strict=True)]

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def infer(self, inputs: TensorDict) -> TensorDict:
        request = self._free.get()
        try:
            results = request.infer(inputs)
            return {name: results[port].copy() for name, port in self._outputs}
        finally:
            self._free.put(request)

    def memory_bytes(self) -> int:
        return self._size_bytes

    def unload(self) -> None:
        while not self._free.empty():
            self._free.get_nowait()


def _metadata(model: Any, configured: int | None, source: str) -> ModelMetadata:
    inputs = tuple(_spec(port) for port in model.inputs)
    outputs = tuple(_spec(port) for port in model.outputs)
    return ModelMetadata("openvino", inputs, outputs,
                         resolve_max_batch_size(configured, inputs + outputs, source))


def _named_dims(path: Path, batched: bool) -> tuple[SameDim, ...]:
    """The free dimensions an ONNX file names and inputs share (OpenVINO's shapes carry no
    names; an IR file has none to read): OpenVINO broadcasts or fails on inputs that
    disagree on one."""
    if path.suffix != ".onnx":
        return ()
    try:
        import onnx

        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # OpenVINO read it: what onnx cannot, it serves unchecked
        return ()
    constants = {initializer.name for initializer in graph.initializer}
    shapes = ((tensor.name, [dim.dim_param or dim.dim_value
                             for dim in tensor.type.tensor_type.shape.dim])
              for tensor in graph.input if tensor.name not in constants)
    return same_dims(shapes, batched)


def _spec(port: Any) -> TensorSpec:
    type_name = port.get_element_type().get_type_name()
    datatype = from_openvino_type(type_name)
    if datatype is None:
        raise ConfigError(f"tensor '{port.get_any_name()}' has type {type_name}, "
                          "which the v2 protocol cannot carry")
    shape = tuple(-1 if dim.is_dynamic else dim.get_length() for dim in port.get_partial_shape())
    return TensorSpec(port.get_any_name(), datatype, shape)


def _import_openvino() -> Any:
    try:
        import openvino
    except ImportError:
        raise ConfigError("backend 'openvino' needs openvino: pip install 'serval-server[openvino]'"
                          ) from None
    return openvino


def _model_file(version_dir: Path) -> Path:
    for name in MODEL_FILES:
        if (version_dir / name).is_file():
            return version_dir / name
    raise ConfigError(f"{version_dir}: no model.xml (OpenVINO IR) or model.onnx")


def _file_bytes(path: Path) -> int:
    weights = path.with_suffix(".bin")
    return path.stat().st_size + (weights.stat().st_size if weights.is_file() else 0)
