"""Inputs for calibration and parity: user samples (.npz or a folder), shipped sentences, or
valid random tensors built from the model's own metadata (vocabulary sizes read from the graph)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from serval.errors import ConfigError
from serval.optimize.deps import require
from serval.protocol.dtypes import NUMERIC_DATATYPES, from_onnx_type, numpy_dtype
from serval.protocol.types import TensorSpec

Feeds = dict[str, np.ndarray]
DEFAULT_SEQUENCE = 32


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One model input (its v2 spec) and the exclusive upper bound of valid integer values
    when the graph reveals one (an embedding table's rows)."""

    tensor: TensorSpec
    int_high: int | None = None

    @property
    def name(self) -> str:
        return self.tensor.name

    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.tensor.datatype)


def sentences() -> list[str]:
    """The few hundred real sentences shipped with Serval (varied domains, a few languages)."""
    text = resources.files("serval.optimize").joinpath("sentences.txt").read_text("utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def input_specs(model_path: Path) -> list[InputSpec]:
    """Inputs of an ONNX model, with integer bounds from the Gather tables they index."""
    onnx = require("onnx")
    model = onnx.load(str(model_path), load_external_data=False)
    graph = model.graph
    initializers = {init.name: tuple(init.dims) for init in graph.initializer}
    bounds = _gather_bounds(graph, initializers)
    specs = []
    for value in graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        datatype = _numeric_datatype(onnx, tensor.elem_type)
        if datatype is None:
            raise ConfigError(f"input '{value.name}': element type {tensor.elem_type} is not "
                              "supported for generated samples; pass --samples")
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        specs.append(InputSpec(TensorSpec(value.name, datatype, shape), bounds.get(value.name)))
    return specs


def _numeric_datatype(onnx: Any, elem_type: int) -> str | None:
    """The v2 datatype of an ONNX element type, if it is numeric (or BOOL)."""
    try:  # ONNX Runtime spells element types as tensor(<TensorProto name, lower case>)
        datatype = from_onnx_type(f"tensor({onnx.TensorProto.DataType.Name(elem_type).lower()})")
    except ValueError:
        return None
    return datatype if datatype in NUMERIC_DATATYPES else None


def _gather_bounds(graph: object, initializers: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Graph input -> rows of the initializer table a Gather indexes with it (through Casts)."""
    producers = {out: node for node in graph.node for out in node.output}  # type: ignore[attr-defined]
    bounds: dict[str, int] = {}
    for node in graph.node:  # type: ignore[attr-defined]
        if node.op_type != "Gather" or node.input[0] not in initializers:
            continue
        source = node.input[1]
        while source in producers and producers[source].op_type in ("Cast", "Identity"):
            source = producers[source].input[0]
        rows = initializers[node.input[0]][0]
        bounds[source] = min(rows, bounds.get(source, rows))
    return bounds


def random_inputs(specs: list[InputSpec], batch: int, seed: int,
                  sequence: int = DEFAULT_SEQUENCE) -> Feeds:
    """Valid random inputs: normal floats, ids below the vocabulary, prefix attention masks."""
    rng = np.random.default_rng(seed)
    feeds: Feeds = {}
    for spec in specs:
        shape = (batch, *(d if d >= 0 else sequence for d in spec.tensor.shape[1:]))
        feeds[spec.name] = _random_tensor(spec, shape, rng)
    return feeds


def _random_tensor(spec: InputSpec, shape: tuple[int, ...],
                   rng: np.random.Generator) -> np.ndarray:
    name = spec.name.lower()
    if spec.dtype.kind == "f":
        return rng.standard_normal(shape).astype(spec.dtype)
    if "mask" in name and len(shape) == 2:
        lengths = rng.integers(1, shape[1] + 1, size=(shape[0], 1))
        return (np.arange(shape[1])[None, :] < lengths).astype(spec.dtype)
    if "type" in name or spec.dtype == np.bool_:
        return np.zeros(shape, dtype=spec.dtype)
    high = spec.int_high or 2
    return rng.integers(0, high, size=shape).astype(spec.dtype)


def load_samples(path: Path, specs: list[InputSpec]) -> Feeds:
    """Inputs from a .npz (one array per input name) or a folder of .npz files (concatenated)."""
    files = sorted(path.glob("*.npz")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise ConfigError(f"{path}: expected a .npz file or a folder of .npz files")
    parts: dict[str, list[np.ndarray]] = {spec.name: [] for spec in specs}
    for file in files:
        with np.load(file) as arrays:
            for spec in specs:
                if spec.name not in arrays:
                    raise ConfigError(f"{file}: no array named '{spec.name}' (the model's "
                                      f"inputs: {', '.join(s.name for s in specs)})")
                parts[spec.name].append(arrays[spec.name].astype(spec.dtype))
    return {name: np.concatenate(arrays) for name, arrays in parts.items()}


def sentence_inputs(tokenizer_path: Path, specs: list[InputSpec], texts: list[str],
                    sequence: int = DEFAULT_SEQUENCE) -> Feeds:
    """Token ids, attention mask (and zero token types) of texts, padded to `sequence`."""
    tokenizers = require("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_path))
    tokenizer.enable_truncation(max_length=sequence)
    tokenizer.enable_padding(length=sequence)
    encodings = tokenizer.encode_batch(texts)
    columns = {"input_ids": [e.ids for e in encodings],
               "attention_mask": [e.attention_mask for e in encodings],
               "token_type_ids": [e.type_ids for e in encodings]}
    feeds = {}
    for spec in specs:
        if spec.name not in columns:
            raise ConfigError(f"input '{spec.name}' cannot be made from text: a tokenizer gives "
                              "input_ids, attention_mask and token_type_ids")
        feeds[spec.name] = np.asarray(columns[spec.name], dtype=spec.dtype)
    return feeds


def take(feeds: Feeds, rows: slice | np.ndarray) -> Feeds:
    """The same rows of every input."""
    return {name: array[rows] for name, array in feeds.items()}


def rows(feeds: Feeds) -> int:
    """How many items (batch rows) the feeds hold."""
    return len(next(iter(feeds.values())))
