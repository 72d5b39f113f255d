"""The PyTorch engine: TorchScript (`model.pt`) or torch.export (`model.pt2`) programs.

torch is optional and imported only when a pytorch model loads. Only archive formats load
(TorchScript's restricted unpickler, torch.export's serialized graph): never arbitrary pickles.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

from serval.backends.base import (
    BackendOptions,
    LoadedModel,
    ModelMetadata,
    ModelVersionSpec,
)
from serval.backends.declared import declared_metadata
from serval.backends.engine import EngineBackend
from serval.errors import BackendError, ConfigError, EngineRejectedInput
from serval.protocol.dtypes import numpy_dtype
from serval.protocol.types import TensorDict, TensorSpec

MODEL_FILES = ("model.pt", "model.pt2")
_PRECISIONS = {"fp16": "float16", "bf16": "bfloat16"}


class TorchBackend(EngineBackend):
    """Loads TorchScript or torch.export programs; torch's threads sized to the cores once."""

    name = "pytorch"

    def __init__(self, cores: int) -> None:
        self.cores = max(1, cores)
        self._threads_set = False
        self._lock = threading.Lock()

    @classmethod
    def from_options(cls, options: BackendOptions) -> TorchBackend:
        return cls(options.cores)

    def load(self, spec: ModelVersionSpec) -> LoadedModel:
        torch = _import_torch()
        self._size_threads(torch)
        path = _model_file(spec.path)
        device = torch.device(spec.config.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device '{spec.config.device}' asked for, but CUDA is not available")
        program = _load_program(torch, path, device)
        dtype = None
        if device.type == "cuda" and spec.config.precision != "fp32":
            dtype = getattr(torch, _PRECISIONS[spec.config.precision])
            program = program.to(dtype)
        metadata = declared_metadata(spec, "pytorch_libtorch")
        return TorchModel(program, metadata, device, dtype, path.stat().st_size)

    def _size_threads(self, torch: Any) -> None:
        with self._lock:
            if not self._threads_set:
                torch.set_num_threads(self.cores)
                self._threads_set = True


class TorchModel:
    """Runs the program under inference_mode; inputs in declared order, outputs by name."""

    def __init__(self, program: Any, metadata: ModelMetadata, device: Any, dtype: Any,
                 size_bytes: int) -> None:
        self._program, self._metadata = program, metadata
        self._device, self._dtype, self._size_bytes = device, dtype, size_bytes
        self._output_dtypes = [numpy_dtype(spec.datatype) for spec in metadata.outputs]

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def infer(self, inputs: TensorDict) -> TensorDict:
        import torch

        tensors = [self._tensor(torch, inputs[spec.name]) for spec in self._metadata.inputs]
        try:
            with torch.inference_mode():
                results = self._program(*tensors)
        except (RuntimeError, IndexError, ValueError, AssertionError) as exc:
            rejected = rejected_input(str(exc))
            if rejected is None:
                raise  # a real engine failure: the batcher answers 500, the log keeps the cause
            raise rejected from exc  # the input values' fault: 400, its batch-mates rerun
        if isinstance(results, torch.Tensor):
            results = (results,)
        elif isinstance(results, dict):
            results = tuple(results[spec.name] for spec in self._metadata.outputs)
        if len(results) != len(self._metadata.outputs):
            raise ConfigError(f"the program returned {len(results)} outputs; config.yaml "
                              f"declares {len(self._metadata.outputs)}")
        return {spec.name: _output(spec, result, dtype)
                for spec, result, dtype in zip(self._metadata.outputs, results,
                                               self._output_dtypes, strict=True)}

    def _tensor(self, torch: Any, array: np.ndarray) -> Any:
        tensor = torch.from_numpy(np.array(array, copy=True))  # owned and writable
        if self._dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(self._dtype)
        return tensor.to(self._device)

    def memory_bytes(self) -> int:
        return self._size_bytes

    def unload(self) -> None:
        self._program = None


def _output(spec: TensorSpec, result: Any, dtype: np.dtype) -> np.ndarray:
    """A floating output in the declared float type (fp16 programs serve FP32); any other as
    the program made it, which must be the declared type (an int64 went out as INT64 to
    clients told INT32, a float was cut to INT32): else a 500 naming it."""
    if result.is_floating_point() and dtype.kind == "f":
        array: np.ndarray = result.detach().float().cpu().numpy().astype(dtype, copy=False)
        return array
    array = result.detach().cpu().numpy()
    if array.dtype != dtype:
        raise BackendError(f"the program's output '{spec.name}' is {array.dtype}, its config "
                           f"declares {spec.datatype}")
    return array


# what torch raises when the input's sizes or values do not fit the program (the config's -1
# dims let any size through): an index outside a table, sizes an op cannot combine. A dtype
# the program does not take is the config's fault, not the client's: not listed.
_INPUT_FAULT = re.compile("|".join((
    r"index out of range", r"out of bounds for dimension", r"index \S+ is out of bounds",
    r"shapes cannot be multiplied", r"must match the size of tensor", r"size mismatch",
    r"Sizes of tensors must match", r"is invalid for input of size", r"Dimension out of range",
    r"expected input\[.*\] to have \d+ channels", r"Expected \d+D .*input",
    r"Kernel size can't be greater than actual input size", r"The expanded size of the tensor",
    r"shape mismatch", r"Expected size for first two dimensions",
    r"^Guard failed: \w+\.size\(\)",  # torch.export: a size its program was not made for
)), re.IGNORECASE)


def rejected_input(engine_message: str) -> EngineRejectedInput | None:
    """torch's account of an input it cannot compute on, as a 400 (None: not such a fault).
    Only the error's last line is kept: TorchScript puts its code, and the file paths of the
    source it was scripted from, above it."""
    lines = [line.strip() for line in engine_message.strip().splitlines() if line.strip()]
    detail = re.sub(r"^\w+(?:Error|Exception): ", "", lines[-1] if lines else "")[:300]
    if not _INPUT_FAULT.search(detail) or "/" in detail:
        return None
    return EngineRejectedInput(f"the model cannot compute on these input values: {detail}",
                               detail)


def _import_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError("backend 'pytorch' needs torch: "
                          "pip install 'serval-server[torch]'") from None
    return torch


def _model_file(version_dir: Path) -> Path:
    for name in MODEL_FILES:
        if (version_dir / name).is_file():
            return version_dir / name
    raise ConfigError(f"{version_dir}: no model.pt (TorchScript) or model.pt2 (torch.export)")


def _load_program(torch: Any, path: Path, device: Any) -> Any:
    try:
        if path.suffix == ".pt2":
            module = torch.export.load(str(path)).module()
            return module.to(device)
        program = torch.jit.load(str(path), map_location=device)
        program.eval()
        return program
    except Exception as exc:
        raise ConfigError(f"{path}: not a loadable {path.suffix} program: {exc}") from None
