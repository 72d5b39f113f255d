"""Step 1: a model as ONNX with a dynamic batch axis (torch `module:factory`, TorchScript,
scikit-learn pipeline, or an ONNX file as is), plus the original kept as the parity reference."""

from __future__ import annotations

import importlib
import pickle
import re
import shutil
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from serval.errors import ConfigError
from serval.optimize.deps import require
from serval.optimize.samples import Feeds

OPSET = 17
SKLEARN_SUFFIXES = (".pkl", ".pickle", ".joblib")
TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".torchscript")
INPUT_SPEC = re.compile(r"([A-Za-z_][\w.]*):(float32|float16|float64|int64|int32|bool)((?::\d+)*)")
Reference = Callable[[Feeds], dict[str, np.ndarray]]


@dataclass(frozen=True, slots=True)
class TensorArg:
    """An input declared on the command line: `name:dtype[:dim...]` (dims exclude the batch)."""

    name: str
    dtype: str
    dims: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Converted:
    """The exported model, what it came from, and the original to compare against."""

    path: Path
    kind: str  # onnx | torch | torchscript | sklearn
    reference: Reference
    reference_name: str


def parse_input(text: str) -> TensorArg:
    """`input_ids:int64:32` -> TensorArg; a precise error for anything else."""
    match = INPUT_SPEC.fullmatch(text)
    if not match:
        raise ConfigError(f"--input {text!r}: expected NAME:DTYPE[:DIM...] with DTYPE one of "
                          "float32, float16, float64, int64, int32, bool (e.g. input:float32:256)")
    dims = tuple(int(d) for d in match.group(3).split(":") if d)
    return TensorArg(match.group(1), match.group(2), dims)


def convert(source: str, out: Path, inputs: list[TensorArg], output_names: list[str]) -> Converted:
    """Write `out` (an ONNX file) from source; the reference runs the original."""
    path = Path(source)
    if path.suffix == ".onnx":
        if not path.is_file():
            raise ConfigError(f"{source}: no such ONNX file")
        reference = _onnx_reference(path)
        shutil.copyfile(path, out)
        return Converted(out, "onnx", reference, f"ONNX Runtime on {path.name}")
    if path.suffix in SKLEARN_SUFFIXES:
        return _from_sklearn(path, out, inputs)
    if path.suffix in TORCHSCRIPT_SUFFIXES:
        if not path.is_file():
            raise ConfigError(f"{source}: no such TorchScript file")
        torch = require("torch", extra="torch")
        module = torch.jit.load(str(path), map_location="cpu").eval()
        return _from_torch(module, out, inputs, output_names, "torchscript", path.name)
    if ":" in source and not path.exists():
        _require_inputs(source, inputs)
        return _from_torch(_factory(source), out, inputs, output_names, "torch", source)
    torchscript, sklearn = ", ".join(TORCHSCRIPT_SUFFIXES), ", ".join(SKLEARN_SUFFIXES)
    raise ConfigError(f"{source}: expected a .onnx file, a TorchScript file ({torchscript}), "
                      f"a pickled scikit-learn model ({sklearn}) or module:factory returning "
                      "a torch nn.Module")


def _require_inputs(name: str, inputs: list[TensorArg]) -> None:
    if not inputs:
        raise ConfigError(f"{name}: a torch model needs its inputs declared: --input "
                          "NAME:DTYPE:DIM... (one per input, dims without the batch axis)")


def _onnx_reference(path: Path) -> Reference:
    session = open_onnx(path)
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(names, feeds), strict=True))


def open_onnx(path: Path) -> Any:
    """An ONNX Runtime session on path; a file it cannot load is a ConfigError naming why."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # ONNX Runtime's pybind errors share no base but Exception
        text = str(exc)
        reason = text.split(" failed:", 1)[1] if " failed:" in text else text
        reason = " ".join(reason.split()) or type(exc).__name__
        raise ConfigError(f"{path}: not a valid ONNX model: {reason}") from None


def _factory(spec: str) -> Any:
    module_name, _, attribute = spec.partition(":")
    if "" not in sys.path:
        sys.path.insert(0, "")  # module:factory is looked up from the current folder first
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{spec}: cannot import the factory ({exc})") from None
    torch = require("torch", extra="torch")
    module = factory()
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"{spec}: the factory returned {type(module).__name__}, not a "
                          "torch nn.Module")
    return module.eval()


def _from_torch(module: Any, out: Path, inputs: list[TensorArg], output_names: list[str],
                kind: str, name: str) -> Converted:
    torch = require("torch", extra="torch")
    require("onnx")
    _require_inputs(name, inputs)
    example = tuple(_example(torch, arg) for arg in inputs)
    outputs = output_names or ["output"]
    axes = {n: {0: "batch"} for n in [*(a.name for a in inputs), *outputs]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, example, str(out), input_names=[a.name for a in inputs],
                          output_names=outputs, dynamic_axes=axes, opset_version=OPSET,
                          do_constant_folding=True, dynamo=False)

    def reference(feeds: Feeds) -> dict[str, np.ndarray]:
        with torch.no_grad():
            result = module(*(torch.from_numpy(feeds[a.name]) for a in inputs))
        tensors = result if isinstance(result, tuple | list) else (result,)
        return {n: t.numpy() for n, t in zip(outputs, tensors, strict=True)}

    return Converted(out, kind, reference, f"torch ({name})")


def _example(torch: Any, arg: TensorArg) -> Any:
    shape = (2, *arg.dims)
    if arg.dtype.startswith("float"):
        return torch.randn(shape, dtype=getattr(torch, arg.dtype))
    if arg.dtype == "bool":
        return torch.ones(shape, dtype=torch.bool)
    return torch.ones(shape, dtype=getattr(torch, arg.dtype))


def _from_sklearn(path: Path, out: Path, inputs: list[TensorArg]) -> Converted:
    skl2onnx = require("skl2onnx")
    require("sklearn", "scikit-learn")
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    with path.open("rb") as handle:  # the user's own model file: pickle is how sklearn saves
        model = pickle.load(handle)
    features = inputs[0].dims[0] if inputs and inputs[0].dims else getattr(
        model, "n_features_in_", None)
    if features is None:
        raise ConfigError(f"{path}: cannot tell the number of features; pass --input "
                          "NAME:float32:FEATURES")
    name = inputs[0].name if inputs else "input"
    from skl2onnx.common.data_types import FloatTensorType

    onnx_model = skl2onnx.convert_sklearn(
        model, initial_types=[(name, FloatTensorType([None, int(features)]))],
        options={id(model): {"zipmap": False}} if hasattr(model, "predict_proba") else None,
        target_opset={"": OPSET, "ai.onnx.ml": 3})
    out.write_bytes(onnx_model.SerializeToString())
    outputs = [o.name for o in onnx_model.graph.output]

    def reference(feeds: Feeds) -> dict[str, np.ndarray]:
        x = feeds[name]
        if hasattr(model, "predict_proba"):
            return dict(zip(outputs, (model.predict(x), model.predict_proba(x)), strict=True))
        return {outputs[0]: np.asarray(model.predict(x)).reshape(len(x), -1)}

    return Converted(out, "sklearn", reference, f"scikit-learn ({type(model).__name__})")
