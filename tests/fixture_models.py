"""Tiny real ONNX models for tests, built with onnx.helper in milliseconds."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _save(graph: onnx.GraphProto, repository: Path, name: str, config: str, version: str = "1"
          ) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    version_dir = repository / name / version
    version_dir.mkdir(parents=True, exist_ok=True)
    path = version_dir / "model.onnx"
    onnx.save(model, str(path))
    (repository / name / "config.yaml").write_text(config)
    return path


def add_sub(repository: Path, name: str = "add_sub", config: str = "max_batch_size: 64\n",
            version: str = "1") -> Path:
    """Triton's 'simple' model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 [B,16]."""
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 16])
          for n in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")]
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        name, io[:2], io[2:],
    )
    return _save(graph, repository, name, config, version)


def linear(repository: Path, name: str = "linear", config: str = "max_batch_size: 32\n",
           seed: int = 0, features: int = 8, classes: int = 4) -> Path:
    """FP32 [B,features] -> softmax(x @ W + b) [B,classes], weights from a fixed seed."""
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((features, classes)).astype(np.float32)
    weight = numpy_helper.from_array(weights, "W")
    bias = numpy_helper.from_array(rng.standard_normal(classes).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["logits"]),
         helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1)],
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", features])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", classes])],
        initializer=[weight, bias],
    )
    return _save(graph, repository, name, config)


def typed_identity(repository: Path, name: str, elem_type: int, width: int = 3,
                   config: str = "max_batch_size: 16\n") -> Path:
    """One input IN of the given ONNX type [B,width] -> OUT = Identity(IN)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["IN"], ["OUT"])], name,
        [helper.make_tensor_value_info("IN", elem_type, ["batch", width])],
        [helper.make_tensor_value_info("OUT", elem_type, ["batch", width])],
    )
    return _save(graph, repository, name, config)


def fixed_shape(repository: Path, name: str = "fixed") -> Path:
    """No batch axis: FP32 [2,3] -> Y = X * 2 (max_batch_size 0)."""
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "two"], ["Y"])], name,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
        initializer=[two],
    )
    return _save(graph, repository, name, "max_batch_size: 0\n")


def first_row_only(repository: Path, name: str = "first_row") -> Path:
    """A broken batch model: always returns 1 row whatever the batch (Slice [0:1])."""
    consts = [numpy_helper.from_array(np.array([v], dtype=np.int64), n)
              for n, v in (("starts", 0), ("ends", 1), ("axes", 0))]
    graph = helper.make_graph(
        [helper.make_node("Slice", ["X", "starts", "ends", "axes"], ["Y"])], name,
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["rows", 4])],
        initializer=consts,
    )
    return _save(graph, repository, name, "max_batch_size: 8\n")


def corrupt(repository: Path, name: str = "corrupt") -> Path:
    """A model folder whose model.onnx is garbage bytes."""
    version_dir = repository / name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    path = version_dir / "model.onnx"
    path.write_bytes(b"\x08\x07this is not an onnx model" * 10)
    return path


def heavy(repository: Path, name: str = "heavy", layers: int = 6, width: int = 384,
          shared_weight: bool = False) -> Path:
    """FP32 [B,width] through `layers` dense+tanh layers: slow enough (~ms) to make batches form.

    shared_weight reuses one matrix in every layer: a long-running model in a small file.
    """
    rng = np.random.default_rng(1)
    nodes, initializers, current = [], [], "x"
    for index in range(layers):
        weight_name = "W" if shared_weight else f"W{index}"
        if index == 0 or not shared_weight:
            weight = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
            initializers.append(numpy_helper.from_array(weight, weight_name))
        nodes.append(helper.make_node("MatMul", [current, weight_name], [f"h{index}"]))
        nodes.append(helper.make_node("Tanh", [f"h{index}"], [f"a{index}"]))
        current = f"a{index}"
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        initializer=initializers,
    )
    return _save(graph, repository, name, "max_batch_size: 128\n")


def slow(repository: Path, name: str = "slow") -> Path:
    """~0.1-0.5 s at batch 128 from a ~4 MB file: holds the engine busy in deadline tests."""
    return heavy(repository, name, layers=60, width=1024, shared_weight=True)


def embedding(repository: Path, name: str = "embed", vocabulary: int = 16, width: int = 4,
              config: str = "max_batch_size: 8\n") -> Path:
    """Token ids INT64 [B,seq] -> their rows of a [vocabulary,width] table (Gather), mean over seq.

    An id outside [-vocabulary, vocabulary) makes ONNX Runtime's Gather fail: the client's fault.
    """
    table = np.arange(vocabulary * width, dtype=np.float32).reshape(vocabulary, width)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),
         helper.make_node("ReduceMean", ["rows"], ["embedding"], axes=[1], keepdims=0)],
        name,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", width])],
        initializer=[numpy_helper.from_array(table, "table")],
    )
    return _save(graph, repository, name, config)


def triton_config(repository: Path, name: str, pbtxt: str) -> Path:
    """Configure a model folder as a Triton user would: config.pbtxt, no config.yaml."""
    (repository / name / "config.yaml").unlink(missing_ok=True)
    path = repository / name / "config.pbtxt"
    path.write_text(pbtxt)
    return path


def double(repository: Path, name: str = "double", config: str = "max_batch_size: 64\n") -> Path:
    """Y = X * 2, FP32 [B,16]: a second model for an ensemble after add_sub."""
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 16]) for n in "XY"]
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    graph = helper.make_graph([helper.make_node("Mul", ["X", "two"], ["Y"])], name,
                              io[:1], io[1:], [two])
    return _save(graph, repository, name, config)


def parse_int(repository: Path, name: str = "parse_int", config: str = "max_batch_size: 64\n"
              ) -> Path:
    """NUMBER (INT64) = TEXT (BYTES [B,1]) cast: numeric strings only (an empty string fails,
    as a warm-up with empty strings did)."""
    text = helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["batch", 1])
    number = helper.make_tensor_value_info("NUMBER", TensorProto.INT64, ["batch", 1])
    graph = helper.make_graph([helper.make_node("Cast", ["TEXT"], ["NUMBER"],
                                                to=TensorProto.INT64)], name, [text], [number])
    return _save(graph, repository, name, config)


def linked_repository(root: Path, source: Path, names: Iterable[str]) -> Path:
    """A repository at ROOT of one model file shared (hard-linked) by many models, each with
    version 1 alone: thousands of models without thousands of copies."""
    for name in names:
        version = root / name / "1"
        version.mkdir(parents=True)
        os.link(source, version / "model.onnx")
    return root
