"""What Triton's Python client examples (triton-inference-server/client, src/python/examples)
do, call for call, against a repository written as a Triton user writes it (config.pbtxt and
model.onnx only): simple infer over HTTP and gRPC (sync, async, aio), strings, health and
metadata, explicit model control, and gRPC's explicit tensor contents."""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
import pytest

from tests import triton_examples
from tests.conftest import RunningServer
from tests.integration.http_helpers import call

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException, np_to_triton_dtype  # noqa: E402

pytestmark = pytest.mark.integration

INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
INPUT1 = np.ones((1, 16), dtype=np.int32)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return triton_examples.build(tmp_path_factory.mktemp("triton-examples"))


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer], repository: Path) -> RunningServer:
    return server_factory(repository)


def _inputs(module: Any, a: np.ndarray, b: np.ndarray, binary: bool = True) -> list[Any]:
    inputs = [module.InferInput("INPUT0", list(a.shape), np_to_triton_dtype(a.dtype)),
              module.InferInput("INPUT1", list(b.shape), np_to_triton_dtype(b.dtype))]
    for tensor, data in zip(inputs, (a, b), strict=True):
        if module is httpclient:
            tensor.set_data_from_numpy(data, binary_data=binary)
        else:
            tensor.set_data_from_numpy(data)
    return inputs


def _outputs(module: Any, binary: bool = True) -> list[Any]:
    if module is httpclient:
        return [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
                httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary)]
    return [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]


def _check_sum_difference(result: Any) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), INPUT0 + INPUT1)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), INPUT0 - INPUT1)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_simple_http_infer_client(server: RunningServer, binary: bool) -> None:
    client = httpclient.InferenceServerClient(server.url)
    result = client.infer("simple", _inputs(httpclient, INPUT0, INPUT1, binary),
                          outputs=_outputs(httpclient, binary), request_id="1")
    _check_sum_difference(result)
    assert result.get_response()["id"] == "1"


def test_simple_http_async_infer_client(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url, concurrency=4)
    pending = [client.async_infer("simple", _inputs(httpclient, INPUT0, INPUT1),
                                  outputs=_outputs(httpclient)) for _ in range(4)]
    for request in pending:
        _check_sum_difference(request.get_result())


def test_simple_http_aio_infer_client(server: RunningServer) -> None:
    import tritonclient.http.aio as aiohttpclient

    async def main() -> None:
        client = aiohttpclient.InferenceServerClient(server.url)
        try:
            assert await client.is_server_live() and await client.is_model_ready("simple")
            _check_sum_difference(await client.infer(
                "simple", _inputs(httpclient, INPUT0, INPUT1), outputs=_outputs(httpclient)))
        finally:
            await client.close()

    asyncio.run(main())


def test_simple_grpc_infer_client(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("simple", _inputs(grpcclient, INPUT0, INPUT1),
                          outputs=_outputs(grpcclient), request_id="7",
                          headers={"test": "1"}, compression_algorithm="gzip")
    _check_sum_difference(result)
    assert result.get_response().id == "7"


def test_simple_grpc_async_infer_client(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    done: queue.Queue[Any] = queue.Queue()
    client.async_infer("simple", _inputs(grpcclient, INPUT0, INPUT1),
                       partial(lambda q, result, error: q.put((result, error)), done),
                       outputs=_outputs(grpcclient))
    result, error = done.get(timeout=30)
    assert error is None
    _check_sum_difference(result)


def test_simple_grpc_aio_infer_client(server: RunningServer) -> None:
    import tritonclient.grpc.aio as aiogrpcclient

    async def main() -> None:
        client = aiogrpcclient.InferenceServerClient(server.grpc_url)
        try:
            assert await client.is_server_ready()
            _check_sum_difference(await client.infer(
                "simple", _inputs(grpcclient, INPUT0, INPUT1), outputs=_outputs(grpcclient)))
        finally:
            await client.close()

    asyncio.run(main())


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_simple_string_infer_client(server: RunningServer, transport: str) -> None:
    module = httpclient if transport == "http" else grpcclient
    client = (httpclient.InferenceServerClient(server.url) if transport == "http"
              else grpcclient.InferenceServerClient(server.grpc_url))
    a = np.array([str(x).encode() for x in INPUT0.reshape(16)], dtype=np.object_).reshape(1, 16)
    b = np.array([str(x).encode() for x in INPUT1.reshape(16)], dtype=np.object_).reshape(1, 16)
    result = client.infer("simple_string", _inputs(module, a, b), outputs=_outputs(module))
    sums = [int(x) for x in result.as_numpy("OUTPUT0").reshape(16)]
    differences = [int(x) for x in result.as_numpy("OUTPUT1").reshape(16)]
    assert sums == list((INPUT0 + INPUT1).reshape(16))
    assert differences == list((INPUT0 - INPUT1).reshape(16))


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_simple_identity_with_strings(server: RunningServer, transport: str) -> None:
    module = httpclient if transport == "http" else grpcclient
    client = (httpclient.InferenceServerClient(server.url) if transport == "http"
              else grpcclient.InferenceServerClient(server.grpc_url))
    # UTF-8 text (ONNX Runtime's Python API hands strings over as str: see docs/triton.md)
    data = np.array([[b"hello"], ["h\u00e9llo \u4e16\u754c".encode()]], dtype=np.object_)
    tensor = module.InferInput("INPUT0", [2, 1], "BYTES")
    tensor.set_data_from_numpy(data)
    assert client.infer("simple_identity", [tensor]).as_numpy("OUTPUT0").tolist() == \
        data.tolist()


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_simple_health_metadata(server: RunningServer, transport: str) -> None:
    client = (httpclient.InferenceServerClient(server.url) if transport == "http"
              else grpcclient.InferenceServerClient(server.grpc_url))
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple")
    assert not client.is_model_ready("simple", "99")
    metadata = client.get_model_metadata("simple")
    config = client.get_model_config("simple")
    if transport == "http":
        assert metadata["name"] == "simple" and metadata["versions"] == ["1"]
        assert [i["name"] for i in metadata["inputs"]] == ["INPUT0", "INPUT1"]
        assert config["max_batch_size"] == 8 and config["platform"] == "onnxruntime_onnx"
    else:
        assert metadata.name == "simple" and list(metadata.versions) == ["1"]
        assert [i.name for i in metadata.inputs] == ["INPUT0", "INPUT1"]
        assert config.config.max_batch_size == 8
        assert config.config.platform == "onnxruntime_onnx"
    assert client.get_server_metadata()  # the examples check its name is "triton": not ours


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_simple_model_control(server_factory: Callable[..., RunningServer], repository: Path,
                              transport: str) -> None:
    explicit = server_factory(repository, "--model-control", "explicit")
    client = (httpclient.InferenceServerClient(explicit.url) if transport == "http"
              else grpcclient.InferenceServerClient(explicit.grpc_url))
    assert not client.is_model_ready("simple")
    client.load_model("simple")
    assert client.is_model_ready("simple")
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    with pytest.raises(InferenceServerException, match="failed to load 'wrong_simple'"):
        client.load_model("wrong_simple")


def _explicit_request(model: str, contents: list[service_pb2.InferTensorContents],
                      datatype: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, content in zip(("INPUT0", "INPUT1"), contents, strict=True):
        request.inputs.append(service_pb2.ModelInferRequest.InferInputTensor(
            name=name, datatype=datatype, shape=[1, 16], contents=content))
    return request


def test_simple_grpc_explicit_int_content_client(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        contents = [service_pb2.InferTensorContents(int_contents=list(map(int, x.reshape(16))))
                    for x in (INPUT0, INPUT1)]
        for model, dtype in (("simple", np.int32), ("simple_int8", np.int8)):
            datatype = "INT32" if dtype is np.int32 else "INT8"
            response = stub.ModelInfer(_explicit_request(model, contents, datatype))
            outputs = {o.name: np.frombuffer(raw, dtype=dtype)
                       for o, raw in zip(response.outputs, response.raw_output_contents,
                                         strict=True)}
            np.testing.assert_array_equal(outputs["OUTPUT0"], (INPUT0 + INPUT1).reshape(16))
            np.testing.assert_array_equal(outputs["OUTPUT1"], (INPUT0 - INPUT1).reshape(16))


def test_simple_grpc_explicit_byte_content_client(server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        contents = [service_pb2.InferTensorContents(
            bytes_contents=[str(v).encode() for v in x.reshape(16)]) for x in (INPUT0, INPUT1)]
        response = stub.ModelInfer(_explicit_request("simple_string", contents, "BYTES"))
        raw = dict(zip((o.name for o in response.outputs), response.raw_output_contents,
                       strict=True))
        sums = _bytes_tensor(raw["OUTPUT0"])
        assert [int(s) for s in sums] == list((INPUT0 + INPUT1).reshape(16))


def _bytes_tensor(raw: bytes) -> list[bytes]:
    """Triton's BYTES wire form: each element a 4-byte little-endian length, then the bytes."""
    items, offset = [], 0
    while offset < len(raw):
        size = int.from_bytes(raw[offset:offset + 4], "little")
        items.append(raw[offset + 4:offset + 4 + size])
        offset += 4 + size
    return items


def test_grpc_contents_beside_raw_contents_is_refused_as_triton_words_it(
        server: RunningServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        contents = [service_pb2.InferTensorContents(int_contents=list(map(int, x.reshape(16))))
                    for x in (INPUT0, INPUT1)]
        request = _explicit_request("simple", contents, "INT32")
        request.raw_input_contents.append(INPUT0.tobytes())
        with pytest.raises(grpc.RpcError) as caught:
            stub.ModelInfer(request)
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "contents field must not be specified when using raw_input_contents for 'INPUT0' " \
           "for model 'simple'" in str(caught.value.details())


@pytest.mark.parametrize("transport", ["http", "grpc"])
@pytest.mark.parametrize("version", ["wrong_specification", "-1"])
def test_a_version_that_is_no_number_is_an_invalid_argument(server: RunningServer,
                                                             transport: str,
                                                             version: str) -> None:
    module = httpclient if transport == "http" else grpcclient
    client = (httpclient.InferenceServerClient(server.url) if transport == "http"
              else grpcclient.InferenceServerClient(server.grpc_url))
    with pytest.raises(InferenceServerException,
                       match="version should be an integral value > 0") as caught:
        client.infer("simple", _inputs(module, INPUT0, INPUT1), model_version=version)
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def test_the_simple_model_through_the_generate_extension(server: RunningServer) -> None:
    """Triton's generate extension on a Triton repository's model: fields in, fields out."""
    body = orjson.dumps({"INPUT0": INPUT0[0].tolist(), "INPUT1": INPUT1[0].tolist()})
    reply = call(server.url, "POST", "/v2/models/simple/generate", body)
    assert reply.status == 200, reply.body
    assert reply.json()["OUTPUT0"] == (INPUT0[0] + INPUT1[0]).tolist()
    assert reply.json()["OUTPUT1"] == (INPUT0[0] - INPUT1[0]).tolist()
