"""Inputs that share a dimension the ONNX file names (dim_param "seq") must agree on its size:
ONNX Runtime failed mid-graph on two sizes (a 500), and both engines broadcast a size of 1
against the other (an answer to a question the model does not take). Now a 400 /
INVALID_ARGUMENT naming the dimension and each input's size, for ONNX Runtime and OpenVINO,
over HTTP and gRPC."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests import fixture_models
from tests.conftest import RunningServer

pytestmark = pytest.mark.integration
ENGINES = {"pair": "max_batch_size: 0\n", "pair_ov": "backend: openvino\nmax_batch_size: 0\n"}


@pytest.fixture(scope="module")
def served(server_factory: Callable[..., RunningServer],
           tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    pytest.importorskip("openvino")
    root = tmp_path_factory.mktemp("named-dims")
    for name, config in ENGINES.items():
        io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["rows", "seq"])
              for n in ("a", "b", "y")]
        graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], name, io[:2],
                                  io[2:])
        fixture_models._save(graph, root, name, config)
    return server_factory(root)


def _inputs(module: object, a: tuple[int, int], b: tuple[int, int]) -> list[object]:
    tensors = []
    for name, shape in (("a", a), ("b", b)):
        tensor = module.InferInput(name, list(shape), "FP32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(np.ones(shape, np.float32))
        tensors.append(tensor)
    return tensors


@pytest.mark.parametrize("model", list(ENGINES))
@pytest.mark.parametrize(("a", "b"), [((2, 5), (2, 3)), ((2, 1), (2, 3))])
def test_inputs_disagreeing_on_a_named_dimension_get_a_400(
        served: RunningServer, model: str, a: tuple[int, int], b: tuple[int, int]) -> None:
    said = (f"inputs disagree on dimension 'seq', which the model gives them all: "
            f"'a' axis 1: {a[1]}, 'b' axis 1: {b[1]}")
    http = httpclient.InferenceServerClient(served.url)
    with pytest.raises(InferenceServerException) as refused:
        http.infer(model, _inputs(httpclient, a, b))
    assert refused.value.status() == "400" and said in refused.value.message()
    grpc = grpcclient.InferenceServerClient(served.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        grpc.infer(model, _inputs(grpcclient, a, b))
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert said in refused.value.message()
    answer = http.infer(model, _inputs(httpclient, (2, 3), (2, 3))).as_numpy("y")
    assert answer is not None and answer.shape == (2, 3) and (answer == 2).all()
    http.close()
    grpc.close()
