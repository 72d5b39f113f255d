"""tritonclient.grpc against a real server: the gRPC twin of every HTTP behaviour."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.conftest import RunningServer
from tests.integration.conftest import TYPED_MODELS
from tests.integration.http_helpers import (
    call,
    wait_until_idle,
    wait_until_queued,
    wait_until_running,
)
from tests.integration.test_tritonclient import TYPED_ARRAYS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(server: RunningServer) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.grpc_url)


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))


def _input(name: str, array: np.ndarray, datatype: str = "FP32") -> triton.InferInput:
    infer_input = triton.InferInput(name, list(array.shape), datatype)
    infer_input.set_data_from_numpy(array)
    return infer_input


def _add_sub_inputs(rows: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, 16)).astype(np.float32),
            rng.standard_normal((rows, 16)).astype(np.float32))


def test_introspection(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add_sub") and not client.is_model_ready("corrupt")
    assert client.get_server_metadata(as_json=True)["name"] == "serval"
    metadata = client.get_model_metadata("linear", as_json=True)
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "8"]}]
    config = client.get_model_config("linear", as_json=True)["config"]
    assert config["max_batch_size"] == 32 and config["input"][0]["data_type"] == "TYPE_FP32"


def test_unary_matches_onnxruntime_and_http(client: triton.InferenceServerClient,
                                            server: RunningServer,
                                            fixture_repository: Path) -> None:
    a, b = _add_sub_inputs()
    result = client.infer("add_sub", [_input("INPUT0", a), _input("INPUT1", b)], request_id="g1")
    expected = ort.InferenceSession(str(fixture_repository / "add_sub/1/model.onnx")).run(
        None, {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected[0])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), expected[1])
    assert result.get_response().id == "g1"
    doc = {"inputs": [{"name": n, "datatype": "FP32", "shape": [3, 16], "data": x.ravel().tolist()}
                      for n, x in (("INPUT0", a), ("INPUT1", b))]}
    http = call(server.url, "POST", "/v2/models/add_sub/infer",
                __import__("orjson").dumps(doc)).json()
    http_out = np.asarray(http["outputs"][0]["data"], dtype=np.float32).reshape(3, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), http_out)


@pytest.mark.parametrize("model", sorted(TYPED_MODELS))
def test_every_datatype_round_trips_raw(client: triton.InferenceServerClient, model: str) -> None:
    array = TYPED_ARRAYS[model]
    datatype = client.get_model_metadata(model, as_json=True)["inputs"][0]["datatype"]
    result = client.infer(model, [_input("IN", array, datatype)]).as_numpy("OUT")
    if model == "id_bytes":
        assert result.tolist() == array.tolist()
    else:
        assert result.dtype == array.dtype
        np.testing.assert_array_equal(result, array)


def test_typed_contents_are_accepted(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    request = service_pb2.ModelInferRequest(model_name="id_int32")
    tensor = request.inputs.add(name="IN", datatype="INT32", shape=[2, 3])
    tensor.contents.int_contents.extend([1, -2, 3, 4, 5, -6])
    response = stub.ModelInfer(request)
    values = np.frombuffer(response.raw_output_contents[0], dtype="<i4").reshape(2, 3)
    assert values.tolist() == [[1, -2, 3], [4, 5, -6]]
    strings = service_pb2.ModelInferRequest(model_name="id_bytes")
    tensor = strings.inputs.add(name="IN", datatype="BYTES", shape=[1, 3])
    tensor.contents.bytes_contents.extend([b"a", b"bc", b""])
    assert len(stub.ModelInfer(strings).raw_output_contents[0]) == 4 * 3 + 3


def test_async_infer(client: triton.InferenceServerClient) -> None:
    a, b = _add_sub_inputs(seed=1)
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.async_infer("add_sub", [_input("INPUT0", a), _input("INPUT1", b)],
                       callback=lambda result, error: answers.put((result, error)))
    result, error = answers.get(timeout=30)
    assert error is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)  # type: ignore[attr-defined]


def test_stream_answers_every_request_with_its_own_rows(server: RunningServer) -> None:
    client = triton.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    sent = {}
    for index in range(40):
        a, b = _add_sub_inputs(rows=1 + index % 3, seed=100 + index)
        sent[str(index)] = a + b
        client.async_stream_infer("add_sub", [_input("INPUT0", a), _input("INPUT1", b)],
                                  request_id=str(index))
    received = [answers.get(timeout=30) for _ in sent]
    client.stop_stream()
    for result, error in received:
        assert error is None
        request_id = result.get_response().id  # type: ignore[attr-defined]
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), sent[request_id])  # type: ignore[attr-defined]


def test_stream_errors_do_not_end_the_stream(server: RunningServer) -> None:
    client = triton.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    a, b = _add_sub_inputs(seed=7)
    client.async_stream_infer("nope", [_input("INPUT0", a)], request_id="bad")
    client.async_stream_infer("add_sub", [_input("INPUT0", a), _input("INPUT1", b)],
                              request_id="good")
    outcomes = [answers.get(timeout=30) for _ in range(2)]
    client.stop_stream()
    errors = [str(error) for _, error in outcomes if error is not None]
    assert len(errors) == 1 and "Request for unknown model: 'nope' is not found" in errors[0]


def test_statistics(client: triton.InferenceServerClient) -> None:
    a, b = _add_sub_inputs(rows=4, seed=3)
    client.infer("add_sub", [_input("INPUT0", a), _input("INPUT1", b)])
    stats = client.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) >= 4 and int(stats["execution_count"]) >= 1
    assert any(int(batch["batch_size"]) == 4 for batch in stats["batch_stats"])
    every = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {"add_sub", "linear"} <= {entry["name"] for entry in every}


def test_statistics_of_an_unknown_model_is_an_error(client: triton.InferenceServerClient
                                                   ) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.get_inference_statistics("nope")
    assert caught.value.status() == "StatusCode.NOT_FOUND"
    assert "requested model 'nope' is not available" in str(caught.value)


def test_an_unknown_model_name_of_any_length_is_not_found_with_a_short_message(
        stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    """The error quotes the name cut short: the whole of a 20 KB name in grpc-message made
    clients fail with RESOURCE_EXHAUSTED (and a proxy reset the stream)."""
    request = service_pb2.ModelInferRequest(model_name="n" * 20_000)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.zeros(1, np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert "Request for unknown model" in caught.value.details()
    assert len(caught.value.details()) < 300


def _raw_request(model: str, *inputs: tuple[str, str, list[int], bytes]
                 ) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype, shape, raw in inputs:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    return request


X8 = np.zeros(8, dtype=np.float32).tobytes()
ERROR_TWINS = [
    (_raw_request("nope", ("x", "FP32", [1, 8], X8)), grpc.StatusCode.NOT_FOUND,
     "Request for unknown model: 'nope' is not found"),
    # the model is looked up before the inputs are read: no input, bad inputs, still NOT_FOUND
    (service_pb2.ModelInferRequest(model_name="nope"), grpc.StatusCode.NOT_FOUND,
     "Request for unknown model: 'nope' is not found"),
    (_raw_request("nope", ("x", "FP99", [1, 8], X8[:3])), grpc.StatusCode.NOT_FOUND,
     "Request for unknown model: 'nope' is not found"),
    (service_pb2.ModelInferRequest(model_name="linear", model_version="9"),
     grpc.StatusCode.NOT_FOUND, "Request for unknown model: 'linear' version 9 is not found"),
    (_raw_request("linear", ("x", "FP99", [1, 8], X8)), grpc.StatusCode.INVALID_ARGUMENT,
     "unknown datatype 'FP99'"),
    (_raw_request("linear", ("x", "INT32", [1, 8], X8)), grpc.StatusCode.INVALID_ARGUMENT,
     "datatype INT32 given, model expects FP32"),
    (_raw_request("linear", ("x", "FP32", [1, 7], X8[:28])), grpc.StatusCode.INVALID_ARGUMENT,
     "shape [1, 7] given, model expects [-1, 8]"),
    (_raw_request("linear", ("x", "FP32", [1, 8], X8[:20])), grpc.StatusCode.INVALID_ARGUMENT,
     "needs 32 bytes, raw_input_contents has 20"),
    (_raw_request("linear", ("y", "FP32", [1, 8], X8)), grpc.StatusCode.INVALID_ARGUMENT,
     "has no input 'y'"),
    (_raw_request("linear", ("x", "FP32", [33, 8], X8 * 33)), grpc.StatusCode.INVALID_ARGUMENT,
     "batch size 33 given, model accepts 1 to 32"),
    (_raw_request("add_sub", ("INPUT0", "FP32", [1, 16], X8 * 2)),
     grpc.StatusCode.INVALID_ARGUMENT, "needs input 'INPUT1'"),
    (_raw_request("corrupt", ("x", "FP32", [1, 8], X8)), grpc.StatusCode.UNAVAILABLE,
     "load failed"),
    (_raw_request("linear", ("x", "FP32", [1, 8], X8), ("x", "FP32", [1, 8], X8)),
     grpc.StatusCode.INVALID_ARGUMENT, "given more than once"),
]


@pytest.mark.parametrize(("request_message", "code", "message"), ERROR_TWINS)
def test_error_twins_of_the_http_cases(stub: service_pb2_grpc.GRPCInferenceServiceStub,
                                       request_message: service_pb2.ModelInferRequest,
                                       code: grpc.StatusCode, message: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request_message)
    assert caught.value.code() == code
    assert message in caught.value.details()
    ok = _raw_request("linear", ("x", "FP32", [1, 8], X8))
    assert stub.ModelInfer(ok).model_name == "linear"


def test_more_error_twins(stub: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    unknown_output = _raw_request("linear", ("x", "FP32", [1, 8], X8))
    unknown_output.outputs.add(name="nope")
    fp16_typed = service_pb2.ModelInferRequest(model_name="id_fp16")
    fp16_typed.inputs.add(name="IN", datatype="FP16", shape=[1, 3])
    mixed = _raw_request("add_sub", ("INPUT0", "FP32", [1, 16], X8 * 2))
    mixed.inputs.add(name="INPUT1", datatype="FP32", shape=[1, 16])
    overflow = service_pb2.ModelInferRequest(model_name="id_int8")
    overflow.inputs.add(name="IN", datatype="INT8", shape=[1, 3]).contents.int_contents.extend(
        [1, 2, 300])
    cases = [(unknown_output, "has no output 'nope'"),
             (fp16_typed, "FP16 has no typed contents field"),
             (mixed, "raw_input_contents has 1 entries for 2 inputs"),
             (overflow, "not valid INT8")]
    for request_message, message in cases:
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request_message)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in caught.value.details()


def test_engine_failure_is_internal_with_request_id(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, server: RunningServer
) -> None:
    request = _raw_request("first_row", ("X", "FP32", [2, 4], np.ones(8, np.float32).tobytes()))
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    details = caught.value.details()
    assert "request id" in details and "rows" not in details
    assert details.split("request id ")[1].split(";")[0] in server.log()


def _slow_count(client: triton.InferenceServerClient) -> int:
    return int(client.get_inference_statistics("slow", as_json=True)["model_stats"][0]
               .get("inference_count", 0))


def _occupy_engine(client: triton.InferenceServerClient, server: RunningServer
                   ) -> threading.Thread:
    """A 128-row request that keeps the slow model's engine busy for a few hundred ms;
    returns once the server reports that batch running."""
    big = _input("x", np.ones((128, 1024), dtype=np.float32))
    blocker = threading.Thread(target=lambda: client.infer("slow", [big]))
    blocker.start()
    wait_until_running(server.url, "slow")
    return blocker


def test_expired_deadline_is_dropped_before_compute(server: RunningServer) -> None:
    """The call waits behind a running batch and a queued one (each ~0.1-0.5 s), so its 50 ms
    pass while it is queued however fast this machine runs the first batch."""
    client = triton.InferenceServerClient(server.grpc_url)
    before = _slow_count(client)
    blocker = _occupy_engine(client, server)
    big = _input("x", np.ones((128, 1024), dtype=np.float32))
    queued = threading.Thread(target=lambda: client.infer("slow", [big]))
    queued.start()
    wait_until_queued(server.url, "slow", 1)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("slow", [_input("x", np.ones((1, 1024), np.float32))], client_timeout=0.05)
    assert "Deadline" in str(caught.value) or "DEADLINE" in str(caught.value.status())
    blocker.join(timeout=30)
    queued.join(timeout=30)
    wait_until_idle(server.url, "slow")  # the expired call has been taken from the queue
    assert _slow_count(client) - before == 256  # only the blockers' rows reached the engine


def test_cancelled_call_frees_its_queue_slot(server: RunningServer) -> None:
    client = triton.InferenceServerClient(server.grpc_url)
    before = _slow_count(client)
    blocker = _occupy_engine(client, server)
    call_context = client.async_infer("slow", [_input("x", np.ones((1, 1024), np.float32))],
                                      callback=lambda result, error: None)
    wait_until_queued(server.url, "slow", 1)  # the call waits behind the running batch
    call_context.cancel()
    blocker.join(timeout=30)
    wait_until_idle(server.url, "slow")  # the cancelled call has been taken from the queue
    assert _slow_count(client) - before == 128
