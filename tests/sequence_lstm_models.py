"""A small LSTM two ways, with the same weights: `lstm_whole` runs a whole sequence at once
(X [B,T,I] -> last hidden state), `lstm_step` one timestep per request with h and c as implicit
state the server keeps (config.yaml sequence_batching), so the last step's answer must equal
the whole run's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

INPUT, HIDDEN = 4, 8
F32 = TensorProto.FLOAT


def _weights(seed: int) -> list[onnx.TensorProto]:
    rng = np.random.default_rng(seed)
    shapes = {"W": (1, 4 * HIDDEN, INPUT), "R": (1, 4 * HIDDEN, HIDDEN), "B": (1, 8 * HIDDEN)}
    return [numpy_helper.from_array(rng.normal(0, 0.5, shape).astype(np.float32), name)
            for name, shape in shapes.items()]


def _save(root: Path, name: str, graph: onnx.GraphProto, config: str) -> None:
    version = root / name / "1"
    version.mkdir(parents=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, version / "model.onnx")
    (root / name / "config.yaml").write_text(config)


def _axis0() -> onnx.TensorProto:
    return numpy_helper.from_array(np.array([0], np.int64), "axis0")


def build(root: Path, seed: int = 7, strategy: str = "direct") -> Path:
    """Both models under `root` (lstm_whole, lstm_step) from one set of weights."""
    whole = helper.make_graph(
        [helper.make_node("Transpose", ["X"], ["x"], perm=[1, 0, 2]),
         helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y", "Y_h"], hidden_size=HIDDEN),
         helper.make_node("Squeeze", ["Y_h", "axis0"], ["H"])],
        "lstm_whole", [helper.make_tensor_value_info("X", F32, ["batch", "time", INPUT])],
        [helper.make_tensor_value_info("H", F32, ["batch", HIDDEN])],
        [*_weights(seed), _axis0()])
    _save(root, "lstm_whole", whole, "max_batch_size: 64\n")
    state = ["batch", HIDDEN]
    step = helper.make_graph(
        [helper.make_node("Transpose", ["X"], ["x"], perm=[1, 0, 2]),
         helper.make_node("Unsqueeze", ["h_in", "axis0"], ["h0"]),
         helper.make_node("Unsqueeze", ["c_in", "axis0"], ["c0"]),
         helper.make_node("LSTM", ["x", "W", "R", "B", "", "h0", "c0"], ["", "h1", "c1"],
                          hidden_size=HIDDEN),
         helper.make_node("Squeeze", ["h1", "axis0"], ["h_out"]),
         helper.make_node("Squeeze", ["c1", "axis0"], ["c_out"]),
         helper.make_node("Identity", ["h_out"], ["H"])],
        "lstm_step", [helper.make_tensor_value_info("X", F32, ["batch", 1, INPUT]),
                      helper.make_tensor_value_info("h_in", F32, state),
                      helper.make_tensor_value_info("c_in", F32, state)],
        [helper.make_tensor_value_info("H", F32, ["batch", HIDDEN]),
         helper.make_tensor_value_info("h_out", F32, state),
         helper.make_tensor_value_info("c_out", F32, state)], [*_weights(seed), _axis0()])
    states = "\n".join(
        f"    - {{input_name: {n}_in, output_name: {n}_out, datatype: FP32, dims: [{HIDDEN}]}}"
        for n in ("h", "c"))
    _save(root, "lstm_step", step,
          f"max_batch_size: 8\nsequence_batching:\n  strategy: {strategy}\n"
          f"  max_sequence_idle_ms: 5000\n  states:\n{states}\n")
    return root
