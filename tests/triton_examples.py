"""The models Triton's Python client examples expect (`simple`, `simple_int8`, `simple_string`,
`simple_identity`), built locally as ONNX models in a repository written the Triton way:
`<model>/config.pbtxt` and `<model>/1/model.onnx`, no Serval file."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

_TYPES = {TensorProto.INT32: "TYPE_INT32", TensorProto.INT8: "TYPE_INT8",
          TensorProto.STRING: "TYPE_STRING"}


def _config(name: str, elem: int, inputs: list[str], outputs: list[str], dims: int) -> str:
    def tensors(names: list[str]) -> str:
        return ",\n".join(f'  {{ name: "{n}" data_type: {_TYPES[elem]} dims: [ {dims} ] }}'
                          for n in names)
    return (f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            f"input [\n{tensors(inputs)}\n]\noutput [\n{tensors(outputs)}\n]\n")


def write_model(root: Path, name: str, graph: onnx.GraphProto, config: str) -> None:
    """A Triton model folder: config.pbtxt and 1/model.onnx."""
    version = root / name / "1"
    version.mkdir(parents=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, version / "model.onnx")
    (root / name / "config.pbtxt").write_text(config)


def _add_sub(root: Path, name: str, elem: int) -> None:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, [B,16]."""
    io = [helper.make_tensor_value_info(n, elem, ["batch", 16])
          for n in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")]
    graph = helper.make_graph([helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
                               helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
                              name, io[:2], io[2:])
    write_model(root, name, graph, _config(name, elem, ["INPUT0", "INPUT1"],
                                      ["OUTPUT0", "OUTPUT1"], 16))


def _string_add_sub(root: Path, name: str) -> None:
    """Triton's simple_string: strings of integers in, their sum and difference as strings."""
    strings = [helper.make_tensor_value_info(n, TensorProto.STRING, ["batch", 16])
               for n in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")]
    nodes = [helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
             helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32),
             helper.make_node("Add", ["a", "b"], ["sum"]),
             helper.make_node("Sub", ["a", "b"], ["difference"]),
             helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
             helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=TensorProto.STRING)]
    graph = helper.make_graph(nodes, name, strings[:2], strings[2:])
    write_model(root, name, graph, _config(name, TensorProto.STRING, ["INPUT0", "INPUT1"],
                                      ["OUTPUT0", "OUTPUT1"], 16))


def _identity(root: Path, name: str) -> None:
    """BYTES [B,-1] -> the same (the string examples send [1,16])."""
    io = [helper.make_tensor_value_info(n, TensorProto.STRING, ["batch", "width"])
          for n in ("INPUT0", "OUTPUT0")]
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                              name, io[:1], io[1:])
    write_model(root, name, graph, _config(name, TensorProto.STRING, ["INPUT0"], ["OUTPUT0"], -1))


def build(root: Path) -> Path:
    _add_sub(root, "simple", TensorProto.INT32)
    _add_sub(root, "simple_int8", TensorProto.INT8)
    _string_add_sub(root, "simple_string")
    _identity(root, "simple_identity")
    return root
