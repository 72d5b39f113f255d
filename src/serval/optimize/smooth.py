"""Activation smoothing before INT8 (SmoothQuant, Xiao et al. 2022): X·W = (X/s)·(s·W).

Dynamic INT8 gives each activation tensor one scale, so a few input channels with large values
(the outliers transformers grow after LayerNorm and GELU) set the scale and every other channel
keeps only a few levels. Per-channel weights have room to spare. For every MatMul, Gemm or
Attention whose weight is a constant matrix used by no other node, the largest |X| of each
input channel is read on calibration data, and each channel j is divided by

    s_j = max|X_j| ** alpha / max|W_j,:| ** (1 - alpha)

before the node (a Mul on its input) while the weight's row j (the row that meets input channel
j: a column of a Gemm's transB weight) is multiplied by it. The model
computes the same function in FP32; in INT8 the activation's range is flatter. Measured on
`minilm` (every node INT8, per-channel weights, 301 shipped sentences): worst row's cosine 0.948
unsmoothed, 0.987 at alpha 0.7, for a 2-4% slower call than without the Mul nodes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from serval.errors import ConfigError
from serval.optimize.deps import require
from serval.optimize.measure import serving_session
from serval.optimize.samples import Feeds, rows, take

SMOOTHED_OPS = ("MatMul", "Gemm", "Attention")
CHUNK = 32  # calibration rows per run while the peaks are read
TINY = 1e-8  # a channel or weight row this close to zero is left unscaled


@dataclass(frozen=True, slots=True)
class SmoothResult:
    """What smoothing did: its alpha, the nodes whose input it scaled, the data it read."""

    alpha: float
    nodes: int
    calibration_items: int

    def describe(self) -> str:
        return (f"alpha {self.alpha:g} on the inputs of {self.nodes} nodes, from "
                f"{self.calibration_items} calibration items")


def check(alpha: float, mode: str | None) -> None:
    """Refuse smoothing for a mode that is not INT8, or an alpha outside (0, 1): at 0 or 1
    one side keeps every outlier."""
    if mode is None or not mode.startswith("int8"):
        raise ConfigError("--smooth applies to INT8: add --quantize int8-auto, int8-dynamic "
                          "or int8-static")
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"--smooth {alpha:g}: expected a number between 0 and 1 (0.5 to 0.8 "
                          "usually; higher moves more of the activations' range into the "
                          "weights)")


def smooth(source: Path, out: Path, calibration: Feeds | None, alpha: float,
           skip: tuple[str, ...] = ()) -> SmoothResult:
    """Write source with its smoothable nodes' inputs smoothed to out; `skip` names nodes left
    as they are (e.g. those kept in FP32)."""
    if calibration is None or rows(calibration) == 0:
        raise ConfigError("--smooth needs calibration data to read the activations' ranges: "
                          "--calibration PATH (.npz or a folder of .npz), or --text-tokenizer "
                          "for text models")
    onnx = require("onnx")
    model = onnx.load(str(source))
    nodes = [node for node in targets(model) if not node.name or node.name not in skip]
    peaks = activation_peaks(model, [node.input[0] for node in nodes], calibration)
    weights = {w.name: w for w in model.graph.initializer}
    numpy_helper = onnx.numpy_helper
    scaled: dict[str, str] = {}  # a scaled node's weight (read by it alone) -> names' prefix
    for node in nodes:
        weight = numpy_helper.to_array(weights[node.input[1]]).astype(np.float32)
        rows_in = _transposed(node)  # Gemm transB=1 keeps the weight as [N, K]
        oriented = weight.T if rows_in else weight  # [K, N]: row k meets input channel k
        peak = peaks[node.input[0]]
        if peak.shape != (oriented.shape[0],):
            continue  # not a plain (..., K) x (K, N) product: leave it
        scale = _scale(peak, np.abs(oriented).max(axis=1), alpha)
        scaled_weight = oriented * scale[:, None]
        weights[node.input[1]].CopyFrom(numpy_helper.from_array(
            np.ascontiguousarray(scaled_weight.T if rows_in else scaled_weight), node.input[1]))
        prefix = node.name or node.input[1]
        model.graph.initializer.append(
            numpy_helper.from_array(1.0 / scale, f"{prefix}/smooth_inverse"))
        scaled[node.input[1]] = prefix
    _insert_muls(onnx, model, scaled)
    onnx.save(model, str(out))
    return SmoothResult(alpha, len(scaled), rows(calibration))


def targets(model: Any) -> list[Any]:
    """MatMul, Gemm (A not transposed) and Attention nodes with a float activation and a
    constant 2-D weight that no other node reads (scaling a shared weight would change its
    other users)."""
    weights = {w.name: w for w in model.graph.initializer}
    uses = Counter(name for node in model.graph.node for name in node.input)
    float_type = require("onnx").TensorProto.FLOAT
    return [node for node in model.graph.node
            if node.op_type in SMOOTHED_OPS and len(node.input) > 1
            and not _attribute(node, "transA")
            and node.input[0] not in weights and node.input[1] in weights
            and len(weights[node.input[1]].dims) == 2
            and weights[node.input[1]].data_type == float_type and uses[node.input[1]] == 1]


def activation_peaks(model: Any, names: list[str], calibration: Feeds) -> dict[str, np.ndarray]:
    """The largest |value| of each last-axis channel of the named tensors over the calibration
    rows, every position included (dynamic INT8's range includes padding too)."""
    onnx = require("onnx")
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    outputs = {o.name for o in probe.graph.output}
    inputs = {i.name for i in probe.graph.input}
    wanted = list(dict.fromkeys(names))
    for name in wanted:
        if name not in outputs and name not in inputs:
            probe.graph.output.append(
                onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    # unoptimized, so that every named tensor still exists to be read
    session: Any = serving_session(probe.SerializeToString(), threads=0, level="disable")
    fetched = [name for name in wanted if name not in inputs]
    feed_names = {i.name for i in session.get_inputs()}
    peaks: dict[str, np.ndarray] = {}
    for start in range(0, rows(calibration), CHUNK):
        chunk = {k: v for k, v in take(calibration, slice(start, start + CHUNK)).items()
                 if k in feed_names}
        values = dict(zip(fetched, session.run(fetched, chunk), strict=True)) if fetched else {}
        values.update({name: chunk[name] for name in wanted if name in inputs})
        for name in wanted:
            value = np.asarray(values[name], dtype=np.float32)
            peak = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
            peaks[name] = np.maximum(peaks[name], peak) if name in peaks else peak
    return peaks


def _attribute(node: Any, name: str) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), 0)


def _transposed(node: Any) -> bool:
    return node.op_type == "Gemm" and bool(_attribute(node, "transB"))


def _scale(activation: np.ndarray, weight: np.ndarray, alpha: float) -> np.ndarray:
    scale = np.ones_like(activation, dtype=np.float32)
    usable = (activation > TINY) & (weight > TINY)
    scale[usable] = activation[usable] ** alpha / weight[usable] ** (1.0 - alpha)
    return scale.astype(np.float32)


def _insert_muls(onnx: Any, model: Any, scaled: dict[str, str]) -> None:
    """A Mul by the inverse scale in front of each scaled node, in topological order."""
    ordered = []
    for original in model.graph.node:
        node = onnx.NodeProto()  # a copy: the graph's own nodes are cleared below
        node.CopyFrom(original)
        prefix = scaled.get(node.input[1]) if len(node.input) > 1 else None
        if prefix is not None:
            ordered.append(onnx.helper.make_node(
                "Mul", [node.input[0], f"{prefix}/smooth_inverse"],
                [f"{prefix}/smoothed_input"], name=f"{prefix}/smooth"))
            node.input[0] = f"{prefix}/smoothed_input"
        ordered.append(node)
    del model.graph.node[:]
    model.graph.node.extend(ordered)
