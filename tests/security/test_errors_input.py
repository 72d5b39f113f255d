"""Issue 15 item 10: client input that once gave 5xx with a traceback now gets a precise 400
(gRPC INVALID_ARGUMENT) saying what was wrong and what is allowed, on a real server."""

from __future__ import annotations

import http.client
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import orjson
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import Reply, call

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]
X8 = [0.5] * 8


@pytest.fixture(scope="module")
def server(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("errors-input")
    fixture_models.linear(root)
    fixture_models.embedding(root)  # ids INT64 [B,seq] over a vocabulary of 16
    fixture_models.embedding(root, "embed_batched", config="max_batch_size: 8\n"
                             "batching:\n  max_queue_delay_ms: 200\n  preferred_batch_sizes: [4]\n")
    fixture_models.embedding(root, "embed_isolated",
                             config="max_batch_size: 8\nisolation: process\n")
    fixture_models.first_row_only(root)
    return server_factory(root, "--repository-api")


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> pb_grpc.GRPCInferenceServiceStub:
    channel = grpc.insecure_channel(server.grpc_url)
    return pb_grpc.GRPCInferenceServiceStub(channel)


def post(server: RunningServer, path: str, body: bytes = b"",
         headers: dict[str, str | bytes] | None = None) -> Reply:
    """A request whose header values may be any bytes (http.client sends bytes as they are)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("POST", path, body=body, headers=headers or {})
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()},
                     response.read())
    finally:
        connection.close()


def infer_doc(shape: list[int], data: list[float] | None = None, name: str = "x",
              datatype: str = "FP32") -> bytes:
    return orjson.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": shape,
                                     "data": [] if data is None else data}]})


def grpc_infer(stub: pb_grpc.GRPCInferenceServiceStub, model: str, name: str, datatype: str,
               shape: list[int], raw: bytes) -> grpc.RpcError:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=10)
    error = caught.value
    assert isinstance(error, grpc.RpcError)
    return error


def assert_clean(server: RunningServer) -> None:
    assert server.process.poll() is None
    assert "Traceback" not in server.log()


# shapes ------------------------------------------------------------------------------------

def test_a_shape_of_more_than_64_dims_is_refused(server: RunningServer,
                                                 stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    reply = post(server, "/v2/models/linear/infer", infer_doc([1] * 65, [0.5]))
    assert reply.status == 400
    assert "65 dimensions" in reply.error and "at most 64" in reply.error
    error = grpc_infer(stub, "linear", "x", "FP32", [1] * 100, b"\0" * 4)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "100 dimensions" in str(error.details()) and "at most 64" in str(error.details())
    assert_clean(server)


def test_a_dimension_of_2_63_or_more_is_refused(server: RunningServer) -> None:
    reply = post(server, "/v2/models/linear/infer", infer_doc([0, 2**63]))
    assert reply.status == 400
    assert str(2**63) in reply.error and "2**63 - 1" in reply.error
    assert_clean(server)


def test_a_negative_dimension_is_refused(server: RunningServer,
                                         stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    reply = post(server, "/v2/models/linear/infer", infer_doc([-1, 8], X8))
    assert reply.status == 400 and "non-negative" in reply.error
    error = grpc_infer(stub, "linear", "x", "FP32", [-2**63, 8], b"")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "negative dimension" in str(error.details())
    assert_clean(server)


def test_a_shape_whose_element_count_overflows_is_refused(
        server: RunningServer, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    reply = post(server, "/v2/models/linear/infer", infer_doc([0, 2**40, 2**40]))
    assert reply.status == 400 and "spans more than 2**56 elements" in reply.error
    binary = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32",
                                       "shape": [2**31, 2**31, 2**31],
                                       "parameters": {"binary_data_size": 4}}]})
    reply = post(server, "/v2/models/linear/infer", binary + b"\0" * 4,
                 {"Inference-Header-Content-Length": str(len(binary))})
    assert reply.status == 400 and "spans more than 2**56 elements" in reply.error
    error = grpc_infer(stub, "linear", "x", "FP32", [0, 2**62, 2**62], b"")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spans more than 2**56 elements" in str(error.details())
    assert_clean(server)


# headers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["inf", "nan", "1e308", "-inf", "86400001"])
def test_a_timeout_that_is_not_a_finite_bounded_number_is_refused(server: RunningServer,
                                                                  value: str) -> None:
    reply = post(server, "/v2/models/linear/infer", infer_doc([1, 8], X8),
                 {"Serval-Timeout-Ms": value})
    assert reply.status == 400
    assert "Serval-Timeout-Ms must be a positive number of milliseconds" in reply.error
    assert "at most 86400000 (one day)" in reply.error and repr(value) in reply.error
    assert post(server, "/v2/models/linear/infer", infer_doc([1, 8], X8),
                {"Serval-Timeout-Ms": "86400000"}).status == 200
    assert_clean(server)


@pytest.mark.parametrize("header", ["Inference-Header-Content-Length", "Content-Encoding",
                                    "Serval-Timeout-Ms"])
def test_non_utf8_bytes_in_a_header_are_refused_and_shown_escaped(
        server: RunningServer, header: str) -> None:
    reply = post(server, "/v2/models/linear/infer", infer_doc([1, 8], X8),
                 {header: b"\xff\xfe1"})
    assert reply.status == 400
    assert header in reply.error and "\\xff\\xfe1" in reply.error
    assert_clean(server)


def test_a_header_length_that_is_not_a_plain_integer_is_refused(server: RunningServer) -> None:
    for value in ("-1", "1_0", "+5", "9" * 30):
        reply = post(server, "/v2/models/linear/infer", infer_doc([1, 8], X8),
                     {"Inference-Header-Content-Length": value})
        assert reply.status == 400, value
        assert "must be a non-negative integer" in reply.error
    assert_clean(server)


# engine errors caused by input values ------------------------------------------------------

def test_token_ids_outside_the_vocabulary_are_a_400_naming_the_problem(
        server: RunningServer, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    reply = post(server, "/v2/models/embed/infer", infer_doc([1, 2], [3, 100], "ids", "INT64"))
    assert reply.status == 400
    assert "idx=100 must be within the inclusive range [-16,15]" in reply.error
    assert "vocabulary" in reply.error and "Name:" not in reply.error
    error = grpc_infer(stub, "embed", "ids", "INT64", [1, 1], (-17).to_bytes(8, "little",
                                                                               signed=True))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "idx=-17" in str(error.details())
    good = post(server, "/v2/models/embed/infer", infer_doc([1, 2], [3, 15], "ids", "INT64"))
    assert good.status == 200
    assert "[E:onnxruntime" not in server.log()  # no ERROR line per bad request
    assert_clean(server)


def test_bad_ids_in_a_batch_fail_only_their_own_request(server: RunningServer) -> None:
    """Four requests batched together, one with an id outside the vocabulary: the engine
    refuses the batch; each request is run alone, so only the bad one gets the 400."""
    ids = [[1, 2], [3, 100], [4, 5], [15, 0]]
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(lambda row: post(
            server, "/v2/models/embed_batched/infer", infer_doc([1, 2], row, "ids", "INT64")),
            ids))
    assert [reply.status for reply in replies] == [200, 400, 200, 200]
    assert "idx=100" in replies[1].error
    assert replies[0].json()["outputs"][0]["data"] == [6.0, 7.0, 8.0, 9.0]  # rows 1, 2 averaged
    stats = call(server.url, "GET", "/v2/models/embed_batched/stats").json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 3
    assert_clean(server)


def test_an_isolated_engine_refusing_input_values_is_a_400_too(server: RunningServer) -> None:
    reply = post(server, "/v2/models/embed_isolated/infer",
                 infer_doc([1, 2], [3, 100], "ids", "INT64"))
    assert reply.status == 400
    assert "idx=100 must be within the inclusive range [-16,15]" in reply.error
    good = post(server, "/v2/models/embed_isolated/infer",
                infer_doc([1, 2], [3, 15], "ids", "INT64"))
    assert good.status == 200  # the worker process kept serving: nothing was restarted
    assert_clean(server)


# model names on load -----------------------------------------------------------------------

def test_a_model_name_of_256_characters_on_load_is_a_400(
        server: RunningServer, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    name = "m" * 256
    reply = post(server, f"/v2/repository/models/{name}/load")
    assert reply.status == 400
    assert "256 bytes is too long" in reply.error and "at most 255" in reply.error
    with pytest.raises(grpc.RpcError) as caught:
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="é" * 200), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "400 bytes is too long" in str(caught.value.details())
    assert post(server, f"/v2/repository/models/{'m' * 255}/load").status == 404
    assert_clean(server)


@pytest.mark.parametrize("name", ["a%00b", "a%5Cb"])
def test_a_model_name_with_a_nul_or_a_separator_on_load_is_a_400(server: RunningServer,
                                                                 name: str) -> None:
    reply = post(server, f"/v2/repository/models/{name}/load")
    assert reply.status == 400
    assert "may not contain '/', '\\' or NUL" in reply.error
    assert_clean(server)


def test_a_model_name_with_a_slash_over_grpc_is_a_400(
        stub: pb_grpc.GRPCInferenceServiceStub, server: RunningServer) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="../linear"),
                                 timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "may not contain '/'" in str(caught.value.details())
    assert_clean(server)


def test_an_invalid_config_override_on_load_is_the_clients_400(server: RunningServer) -> None:
    for parameters, expected in (
            ({"config": {"max_batch_size": "many"}},
             "parameter 'config' is not valid for model 'linear': field 'max_batch_size'"),
            ({"config": '{"max_batch_size": "many"}'}, "field 'max_batch_size'"),
            ({"config": 5}, "parameter 'config' must be a JSON object of config.yaml settings"),
            ({"config": "[1]"}, "parameter 'config' must be a JSON object")):
        reply = post(server, "/v2/repository/models/linear/load",
                     orjson.dumps({"parameters": parameters}))
        assert reply.status == 400, (parameters, reply.body)
        assert expected in reply.error
        assert "/tmp" not in reply.error
    assert post(server, "/v2/models/linear/infer", infer_doc([1, 8], X8)).status == 200
    assert_clean(server)


def test_a_file_name_over_255_bytes_on_load_is_the_clients_400(server: RunningServer) -> None:
    for key in ("file:1/" + "a" * 256, "file:" + "d" * 300 + "/model.onnx"):
        reply = post(server, "/v2/repository/models/long_files/load", orjson.dumps(
            {"parameters": {"config": "{}", key: "eA=="}}))
        assert reply.status == 400, reply.body  # was a 503 "File name too long"
        assert "a file or folder name in the path is longer than 255 bytes" in reply.error
        assert "/tmp" not in reply.error
    assert_clean(server)


def _deep(levels: int, leaf: str) -> str:
    return "[" * levels + leaf + "]" * levels


@pytest.mark.parametrize(("path", "body", "expected"), [
    ("/v2/models/linear/infer",
     '{"inputs": [{"name": "x", "datatype": "BYTES", "shape": [1, 1], "data": '
     + _deep(1000, '"a"') + "}]}", "input 'x': 'data' nests lists more than 64 deep"),
    ("/v2/models/linear/infer",
     '{"inputs": [{"name": "x", "datatype": "FP32", "shape": ' + _deep(1000, "1")
     + ', "data": [1]}]}', "shape must be a list of non-negative integers, got [[[["),
    ("/v2/models/linear/generate", '{"x": ' + _deep(1000, "1") + "}",
     "generate field 'x' must be a string, number or boolean, or a rectangular list of them"),
    ("/v2/models/linear/generate", '{"x": 1, "y": ' + _deep(1000, "1") + "}",
     "generate request parameter 'y' must be a string, number or boolean, got [[[["),
    ("/v2/logging", '{"log_verbose_level": ' + _deep(1000, "1") + "}",
     "log setting 'log_verbose_level' must be an integer"),
    ("/v2/trace/setting", '{"trace_rate": ' + _deep(1000, "1") + "}",
     "trace setting 'trace_rate' must be a string or a list of strings, got [[[["),
])
def test_json_nested_1000_deep_is_a_400_naming_the_field(server: RunningServer, path: str,
                                                         body: str, expected: str) -> None:
    reply = post(server, path, body.encode())  # was a 500: RecursionError in repr or numpy
    assert reply.status == 400, reply.body
    assert expected in reply.error and len(reply.error) < 400
    assert_clean(server)


# last: a real engine failure logs its traceback (as it should), which the tests above check
# is absent for client errors
def test_a_real_engine_failure_stays_500_with_generic_text(server: RunningServer) -> None:
    reply = post(server, "/v2/models/first_row/infer", infer_doc([2, 4], [1.0] * 8, "X"))
    assert reply.status == 500
    assert reply.error.startswith("the model failed to run the request (request id ")
    assert "returned 1 rows" not in reply.error
