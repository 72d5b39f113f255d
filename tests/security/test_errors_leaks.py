"""Issue 15 item 12: answers name the model and the problem, never the repository's filesystem
path; pipeline errors never name their internal steps or why those failed inside. The server
log keeps the full reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

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

CHAIN = """\
backend: pipeline
max_batch_size: 8
inputs:
  - {{name: ids, datatype: INT64, dims: [-1]}}
outputs:
  - {{name: {output}, datatype: FP32, dims: [4]}}
steps:
  - model: embed
    inputs: {{ids: ids}}
    outputs: {{embedding: e}}
{more}"""
SECOND_STEP = """\
  - model: {model}
    inputs: {{X: e}}
    outputs: {{Y: out}}
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("errors-leaks")
    fixture_models.linear(root)
    fixture_models.embedding(root)
    fixture_models.first_row_only(root)  # returns 1 row whatever the batch: an engine fault
    fixture_models.corrupt(root)
    fixture_models.linear(root, "badconfig", config="max_batch_size: many\n")
    pipelines = {
        "vocab_chain": CHAIN.format(output="e", more=""),
        "failing_chain": CHAIN.format(output="out", more=SECOND_STEP.format(model="first_row")),
        "missing_chain": CHAIN.format(output="out",
                                      more=SECOND_STEP.format(model="hidden_step_model")),
    }
    for name, config in pipelines.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.yaml").write_text(config)
    return root


@pytest.fixture(scope="module")
def server(server_factory: Factory, repository: Path) -> RunningServer:
    return server_factory(repository, "--repository-api")


@pytest.fixture(scope="module")
def stub(server: RunningServer) -> pb_grpc.GRPCInferenceServiceStub:
    return pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))


def infer(server: RunningServer, model: str, name: str, datatype: str, shape: list[int],
          data: list[float]) -> Reply:
    doc = {"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}]}
    return call(server.url, "POST", f"/v2/models/{model}/infer", orjson.dumps(doc))


def grpc_infer(stub: pb_grpc.GRPCInferenceServiceStub, model: str, name: str, datatype: str,
               shape: list[int], contents: list[int] | list[float]) -> grpc.RpcError:
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
    if datatype == "INT64":
        tensor.contents.int64_contents.extend([int(v) for v in contents])
    else:
        tensor.contents.fp32_contents.extend(contents)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request, timeout=10)
    return caught.value


def assert_no_path(text: str | bytes, repository: Path) -> None:
    shown = text.decode(errors="replace") if isinstance(text, bytes) else text
    assert str(repository) not in shown
    assert str(repository.parent) not in shown
    assert "/tmp" not in shown


# the repository's path ---------------------------------------------------------------------

def test_a_503_for_a_model_that_failed_to_load_names_no_path(
        server: RunningServer, repository: Path, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    reply = infer(server, "corrupt", "x", "FP32", [1, 8], [0.5] * 8)
    assert reply.status == 503
    assert "'corrupt'" in reply.error and "load failed" in reply.error
    assert_no_path(reply.body, repository)
    error = grpc_infer(stub, "corrupt", "x", "FP32", [1, 8], [0.5] * 8)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "load failed" in str(error.details())
    assert_no_path(str(error.details()), repository)
    assert f"{repository}/corrupt" in server.log()  # the log keeps the full reason


def test_a_model_with_an_invalid_config_answers_without_the_path(
        server: RunningServer, repository: Path) -> None:
    reply = infer(server, "badconfig", "x", "FP32", [1, 8], [0.5] * 8)
    assert reply.status == 503
    assert "badconfig/config.yaml" in reply.error and "max_batch_size" in reply.error
    assert_no_path(reply.body, repository)


def test_the_repository_index_and_status_pages_name_no_path(
        server: RunningServer, repository: Path) -> None:
    index = call(server.url, "POST", "/v2/repository/index")
    assert index.status == 200
    reasons = {entry["name"]: entry["reason"] for entry in index.json()}
    assert "load failed" in reasons["corrupt"]
    assert_no_path(index.body, repository)
    for path in ("/status", "/status/models", "/status/models/corrupt"):
        page = call(server.url, "GET", path)
        assert page.status == 200, path
        assert_no_path(page.body, repository)


def test_a_404_on_load_shows_no_path(server: RunningServer, repository: Path,
                                     stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    reply = call(server.url, "POST", "/v2/repository/models/nope/load")
    assert reply.status == 404
    assert reply.error == "failed to load 'nope': no model folder of that name in the repository"
    with pytest.raises(grpc.RpcError) as caught:
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="nope"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert_no_path(str(caught.value.details()), repository)


def test_a_failed_load_through_the_api_shows_no_path(
        server: RunningServer, stub: pb_grpc.GRPCInferenceServiceStub, repository: Path) -> None:
    """A broken model's load is the caller's to fix, not to retry: 400 / INVALID_ARGUMENT,
    as Triton's load."""
    reply = call(server.url, "POST", "/v2/repository/models/corrupt/load")
    assert reply.status == 400
    assert "failed to load 'corrupt'" in reply.error and "model.onnx" in reply.error
    assert_no_path(reply.body, repository)
    with pytest.raises(grpc.RpcError) as caught:
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="corrupt"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == reply.error


# pipelines ---------------------------------------------------------------------------------

def test_an_input_error_in_a_pipeline_names_the_input_not_the_step(
        server: RunningServer, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    reply = infer(server, "vocab_chain", "ids", "INT64", [1, 2], [1, 100])
    assert reply.status == 400
    assert reply.error == ("pipeline 'vocab_chain' cannot compute on the values of input 'ids': "
                           "indices element out of data bounds, idx=100 must be within the "
                           "inclusive range [-16,15]")
    error = grpc_infer(stub, "vocab_chain", "ids", "INT64", [1, 2], [1, 100])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == reply.error  # one mapping for both transports
    assert infer(server, "vocab_chain", "ids", "INT64", [1, 2], [1, 15]).status == 200


def test_an_engine_failure_in_a_pipeline_step_is_generic(
        server: RunningServer, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    reply = infer(server, "failing_chain", "ids", "INT64", [2, 1], [1, 2])
    assert reply.status == 500
    assert reply.error.startswith("pipeline 'failing_chain' failed to run the request "
                                  "(request id ")
    assert "first_row" not in reply.error and "step" not in reply.error
    error = grpc_infer(stub, "failing_chain", "ids", "INT64", [2, 1], [1, 2])
    assert error.code() == grpc.StatusCode.INTERNAL
    assert str(error.details()).startswith("pipeline 'failing_chain' failed to run the request")
    assert "step 2 ('first_row')" in server.log()  # the operator still learns which step


def test_a_pipeline_with_a_missing_step_model_does_not_name_it(
        server: RunningServer, stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    reply = infer(server, "missing_chain", "ids", "INT64", [1, 1], [1])
    assert reply.status == 503  # it did not load: its step's model is missing
    assert "one of its models is not ready" in reply.error
    assert "hidden_step_model" not in reply.error
    error = grpc_infer(stub, "missing_chain", "ids", "INT64", [1, 1], [1])
    assert error.code() == grpc.StatusCode.UNAVAILABLE and error.details() == reply.error
    assert "hidden_step_model" in server.log()
