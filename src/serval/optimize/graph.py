"""Step 2: offline graph optimization saved as a model file, so serving does not redo it:
ONNX Runtime's extended level (constant folding, redundant nodes, fusions) for any model, and
the transformer optimizer (attention, LayerNorm, GELU, embedding fusions) for BERT-like models."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serval.errors import ConfigError
from serval.optimize.deps import require


@dataclass(frozen=True, slots=True)
class GraphResult:
    """What the optimizer did: which pass, fused operator counts, nodes before and after."""

    method: str
    nodes_before: int
    nodes_after: int
    fused: dict[str, int] = field(default_factory=dict)


def optimize_graph(source: Path, out: Path, *, transformer: bool | None = None,
                   num_heads: int = 0, hidden_size: int = 0) -> GraphResult:
    """Optimize source into out; transformer=None picks the transformer path for BERT-likes."""
    onnx = require("onnx")
    model = onnx.load(str(source))
    before = len(model.graph.node)
    if transformer is None:
        transformer = looks_like_bert(model)
    if not transformer:
        _ort_offline(source, out)
        return GraphResult("onnxruntime extended", before, len(onnx.load(str(out)).graph.node))
    if not (num_heads and hidden_size):
        num_heads, hidden_size = detect_attention(model, num_heads, hidden_size)
    from onnxruntime.transformers import optimizer

    logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
    optimized = optimizer.optimize_model(str(source), model_type="bert", num_heads=num_heads,
                                         hidden_size=hidden_size, opt_level=1)
    fused = {k: int(v) for k, v in optimized.get_fused_operator_statistics().items() if v}
    optimized.save_model_to_file(str(out))
    return GraphResult(f"onnxruntime transformer optimizer (bert, {num_heads} heads, hidden "
                       f"{hidden_size})", before, len(optimized.model.graph.node), fused)


def _ort_offline(source: Path, out: Path) -> None:
    """Extended, not all: the saved file stays portable (no CPU-specific layouts)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])


def looks_like_bert(model: Any) -> bool:
    """Token ids in, Softmax and LayerNorm-ish ops inside: a BERT-like encoder."""
    names = {value.name for value in model.graph.input}
    ops = {node.op_type for node in model.graph.node}
    return "input_ids" in names and "Softmax" in ops and bool(
        ops & {"LayerNormalization", "ReduceMean"})


def detect_attention(model: Any, num_heads: int = 0, hidden_size: int = 0) -> tuple[int, int]:
    """(heads, hidden) from the graph: hidden is the LayerNorm width, heads come from the Reshape
    that splits it ([batch, seq, heads, head_size], or -1 for the heads)."""
    from onnx import numpy_helper

    constants = _constants(model, numpy_helper)
    hidden = hidden_size or _layer_norm_width(model, constants)
    if not hidden:
        raise ConfigError("cannot detect the transformer's hidden size; pass --hidden-size")
    producers = {out: node for node in model.graph.node for out in node.output}
    for node in model.graph.node:
        if node.op_type != "Reshape" or node.input[1] not in producers:
            continue
        concat = producers[node.input[1]]
        if concat.op_type != "Concat":
            continue
        values = [_scalar(constants, producers, name) for name in concat.input]
        for first, second in itertools.pairwise(values):
            if first and second and first > 1 and first * second == hidden:
                return num_heads or first, hidden
            if first == -1 and second and second > 1 and hidden % second == 0:
                return num_heads or hidden // second, hidden  # [batch, seq, -1, head_size]
    raise ConfigError("cannot detect the number of attention heads; pass --num-heads")


def _constants(model: Any, numpy_helper: Any) -> dict[str, Any]:
    found = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            found[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return found


def _scalar(constants: dict[str, Any], producers: dict[str, Any], name: str) -> int | None:
    if name not in constants and name in producers and producers[name].op_type == "Unsqueeze":
        name = producers[name].input[0]
    value = constants.get(name)
    return int(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def _layer_norm_width(model: Any, constants: dict[str, Any]) -> int:
    for node in model.graph.node:
        if node.op_type == "LayerNormalization" and node.input[1] in constants:
            return int(constants[node.input[1]].shape[-1])
    return 0
