"""Sequence batching of Triton Python models on a real server, over HTTP and gRPC: execute()
gets one request per sequence step, with the control inputs its config names (START, END,
READY, CORRID) and its implicit state; sequences interleaved across requests keep apart."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.conftest import RunningServer

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.integration

# A running sum per CORRID kept by the model itself (Triton's explicit-state style); each
# request must be one step of one sequence, with its own controls.
CONTROLLED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            def get(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy()
            value, start, end, ready = get("INPUT"), get("START"), get("END"), get("READY")
            corrid = int(get("CORRID").flat[0])
            assert value.shape == (1, 1) and start.shape == (1, 1) and ready.flat[0] == 1
            assert corrid == request.correlation_id()
            if start.flat[0]:
                self.sums[corrid] = 0
            self.sums[corrid] += int(value.flat[0])
            total = np.full((1, 1), self.sums[corrid], np.int32)
            if end.flat[0]:
                del self.sums[corrid]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", total)]))
        return responses
'''
CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""
# The same sum in implicit state: the server keeps ACC_OUT and feeds it back as ACC_IN.
STATEFUL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            kept = pb_utils.get_input_tensor_by_name(request, "ACC_IN").as_numpy()
            total = (kept + value).astype(np.int32)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("ACC_OUT", total)]))
        return responses
'''
STATE = """
  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "z" } } ]
"""
PBTXT = """
backend: "python"
max_batch_size: 8
sequence_batching { max_sequence_idle_microseconds: 5000000 BODY }
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
MODELS = ("py_controlled", "py_stateful")


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer],
           tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("python-sequences")
    for name, source, body in (
            ("py_controlled", CONTROLLED, CONTROLS), ("py_stateful", STATEFUL, STATE),
            ("py_decoupled_sequence", STATEFUL,
             STATE + "} model_transaction_policy { decoupled: true ")):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(PBTXT.replace("BODY", body))
    return server_factory(root, "--allow-python-models")


def _step(client: Any, module: Any, model: str, value: int, **sequence: Any) -> int:
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return int(client.infer(model, [tensor], **sequence).as_numpy("OUTPUT")[0, 0])


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_interleaved_sequences_keep_their_own_sums(server: RunningServer, transport: str,
                                                   model: str) -> None:
    module = httpclient if transport == "http" else grpcclient
    client = module.InferenceServerClient(server.url if transport == "http"
                                          else server.grpc_url)
    base = 1000 if transport == "http" else 2000
    values = {base + 1: [1, 2, 3, 4], base + 2: [10, 20, 30, 40]}
    sums: dict[int, list[int]] = {key: [] for key in values}
    for index in range(4):
        for key, series in values.items():
            sums[key].append(_step(client, module, model, series[index], sequence_id=key,
                                   sequence_start=index == 0, sequence_end=index == 3))
    assert sums == {base + 1: [1, 3, 6, 10], base + 2: [10, 30, 60, 100]}
    # started again, the sum starts again (the state, or the model's own dict, is fresh)
    assert _step(client, module, model, 5, sequence_id=base + 1, sequence_start=True,
                 sequence_end=True) == 5
    metadata = client.get_model_metadata(model)
    names = ([t["name"] for t in metadata["inputs"]] if transport == "http"
             else [t.name for t in metadata.inputs])
    assert names == ["INPUT"]  # controls and state stay the server's


def test_a_decoupled_sequence_model_is_refused_at_load(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    entry = index["py_decoupled_sequence"]
    assert entry["state"] == "UNAVAILABLE"
    assert "sequence_batching is not supported for decoupled models" in entry["reason"]
    with pytest.raises(InferenceServerException):
        _step(client, httpclient, "py_decoupled_sequence", 1, sequence_id=7,
              sequence_start=True)
