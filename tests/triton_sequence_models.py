"""The sequence models Triton's sequence client examples expect, built locally as ONNX models
in a repository written the Triton way (`config.pbtxt` with `sequence_batching`, no Serval
file); the server fills their control inputs and carries their implicit state:

- simple_sequence: OUTPUT = INPUT + START (controls START, READY; any sequence id);
- simple_dyna_sequence: OUTPUT = INPUT + START, plus the CORRID (UINT64) on the END step;
- simple_string_dyna_sequence: an accumulator in implicit state (zeros on START), plus the
  CORRID (a STRING id, read as an integer) on the END step;
- accumulate: FP32 accumulator in implicit state, oldest strategy (Serval's own tests);
- accumulate_from_file: the same, its initial state read from initial_state/start.bin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tests.triton_examples import write_model

I32 = TensorProto.INT32


def _io(name: str, elem: int) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, ["batch", 1])


def _control(name: str, kind: str) -> str:
    return (f'  {{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} '
            "int32_false_true: [ 0, 1 ] } ] }")


def _corrid(name: str, data_type: str) -> str:
    return (f'  {{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_CORRID '
            f"data_type: {data_type} }} ] }}")


def _state(input_name: str, output_name: str, data_type: str) -> str:
    return (f'  {{ input_name: "{input_name}" output_name: "{output_name}" '
            f"data_type: {data_type} dims: [ 1 ] initial_state: {{ data_type: {data_type} "
            'dims: [ 1 ] zero_data: true name: "zero" } }')


def _config(name: str, controls: list[str], states: list[str], data_type: str = "TYPE_INT32",
            strategy: str = "") -> str:
    state = "  state [\n" + ",\n".join(states) + "\n  ]\n" if states else ""
    control = "  control_input [\n" + ",\n".join(controls) + "\n  ]\n" if controls else ""
    return (f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            f"sequence_batching {{\n{strategy}  max_sequence_idle_microseconds: 5000000\n"
            f"{control}{state}}}\n"
            f'input [ {{ name: "INPUT" data_type: {data_type} dims: [ 1 ] }} ]\n'
            f'output [ {{ name: "OUTPUT" data_type: {data_type} dims: [ 1 ] }} ]\n')


def _simple_sequence(root: Path) -> None:
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["sum"]),
             helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"])]
    graph = helper.make_graph(nodes, "simple_sequence",
                              [_io(n, I32) for n in ("INPUT", "START", "READY")],
                              [_io("OUTPUT", I32)])
    write_model(root, "simple_sequence", graph, _config(
        "simple_sequence", [_control("START", "START"), _control("READY", "READY")], []))


def _simple_dyna_sequence(root: Path) -> None:
    nodes = [helper.make_node("Cast", ["CORRID"], ["corrid"], to=I32),
             helper.make_node("Mul", ["END", "corrid"], ["last"]),
             helper.make_node("Add", ["INPUT", "START"], ["sum"]),
             helper.make_node("Add", ["sum", "last"], ["total"]),
             helper.make_node("Mul", ["total", "READY"], ["OUTPUT"])]
    inputs = [_io(n, I32) for n in ("INPUT", "START", "END", "READY")]
    graph = helper.make_graph(nodes, "simple_dyna_sequence",
                              [*inputs, _io("CORRID", TensorProto.UINT64)], [_io("OUTPUT", I32)])
    controls = [_control("START", "START"), _control("END", "END"), _control("READY", "READY"),
                _corrid("CORRID", "TYPE_UINT64")]
    write_model(root, "simple_dyna_sequence", graph, _config("simple_dyna_sequence", controls, []))


def _string_dyna_sequence(root: Path) -> None:
    name = "simple_string_dyna_sequence"
    nodes = [helper.make_node("Add", ["ACC_IN", "INPUT"], ["ACC_OUT"]),
             helper.make_node("Cast", ["CORRID"], ["corrid"], to=I32),
             helper.make_node("Mul", ["END", "corrid"], ["last"]),
             helper.make_node("Add", ["ACC_OUT", "last"], ["OUTPUT"])]
    inputs = [_io(n, I32) for n in ("INPUT", "END", "ACC_IN")]
    graph = helper.make_graph(nodes, name, [*inputs, _io("CORRID", TensorProto.STRING)],
                              [_io("OUTPUT", I32), _io("ACC_OUT", I32)])
    controls = [_control("END", "END"), _corrid("CORRID", "TYPE_STRING")]
    write_model(root, name, graph, _config(name, controls, [_state("ACC_IN", "ACC_OUT",
                                                              "TYPE_INT32")]))


def _accumulate(root: Path) -> None:
    """FP32: OUTPUT = the sum of the sequence's INPUTs so far (oldest strategy, 2 candidates)."""
    f32 = TensorProto.FLOAT
    nodes = [helper.make_node("Add", ["STATE_IN", "INPUT"], ["STATE_OUT"]),
             helper.make_node("Identity", ["STATE_OUT"], ["OUTPUT"])]
    graph = helper.make_graph(nodes, "accumulate", [_io("INPUT", f32), _io("STATE_IN", f32)],
                              [_io("OUTPUT", f32), _io("STATE_OUT", f32)])
    strategy = "  oldest { max_candidate_sequences: 2 }\n"
    config = _config("accumulate", [], [_state("STATE_IN", "STATE_OUT", "TYPE_FP32")],
                     "TYPE_FP32", strategy)
    write_model(root, "accumulate", graph, config.replace("5000000", "300000"))


def _accumulate_from_file(root: Path) -> None:
    """accumulate's graph, its sums starting from the initial state in
    initial_state/start.bin (FP32 100.0), not zeros."""
    f32 = TensorProto.FLOAT
    nodes = [helper.make_node("Add", ["STATE_IN", "INPUT"], ["STATE_OUT"]),
             helper.make_node("Identity", ["STATE_OUT"], ["OUTPUT"])]
    graph = helper.make_graph(nodes, "accumulate_from_file",
                              [_io("INPUT", f32), _io("STATE_IN", f32)],
                              [_io("OUTPUT", f32), _io("STATE_OUT", f32)])
    state = ('  { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 '
             'dims: [ 1 ] initial_state: { data_type: TYPE_FP32 dims: [ 1 ] '
             'data_file: "start.bin" name: "hundred" } }')
    write_model(root, "accumulate_from_file", graph,
                _config("accumulate_from_file", [], [state], "TYPE_FP32"))
    (root / "accumulate_from_file" / "initial_state").mkdir()
    (root / "accumulate_from_file" / "initial_state" / "start.bin").write_bytes(
        np.array([100.0], "<f4").tobytes())


_BUILDERS = {"simple_sequence": _simple_sequence, "simple_dyna_sequence": _simple_dyna_sequence,
             "simple_string_dyna_sequence": _string_dyna_sequence, "accumulate": _accumulate,
             "accumulate_from_file": _accumulate_from_file}


def build_one(root: Path, name: str) -> None:
    """One of the models, by name."""
    _BUILDERS[name](root)


def build(root: Path) -> Path:
    for builder in _BUILDERS.values():
        builder(root)
    return root
