"""Large tensors in their typed, element-by-element forms on a real server: REST JSON is
decoded and encoded in the helper process, BYTES elements on a thread, gRPC typed contents
read from their packed bytes (how long each held the event loop before, and now, is
bench/loop_stalls.py's); the answers and the errors are those the loop would give; a helper
process that dies is replaced."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call

pytestmark = pytest.mark.integration
ROWS = 100_000  # X: FP32 [ROWS, 16], 1.6M numbers (~14 MB as JSON)


@pytest.fixture(scope="module")
def doubling(server_factory: Callable[..., RunningServer],
             tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("large-json")
    fixture_models.double(root, config="max_batch_size: 0\n")
    fixture_models.parse_int(root, config="max_batch_size: 0\n")
    return server_factory(root)


def _body(x: np.ndarray, binary_output: bool = False) -> bytes:
    return orjson.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": list(x.shape),
                                     "data": x.ravel().tolist()}],
                         "parameters": {"binary_data_output": binary_output}})


def _x(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((ROWS, 16), dtype=np.float32)


def test_large_json_requests_are_coded_in_the_helper(doubling: RunningServer) -> None:
    """1.6M JSON numbers in and 1.6M out go through the helper process (on the event loop
    they held it ~0.5 s a request: bench/loop_stalls.py); the answer is the loop's."""
    x = _x(1)
    body = _body(x)
    reply = call(doubling.url, "POST", "/v2/models/double/infer", body)
    assert reply.status == 200, reply.body[:300]
    [output] = orjson.loads(reply.body)["outputs"]
    assert output["shape"] == [ROWS, 16] and output["datatype"] == "FP32"
    np.testing.assert_array_equal(np.asarray(output["data"], np.float32), (x * 2).ravel())


def test_grpc_typed_contents_read_packed(doubling: RunningServer) -> None:
    """fp32_contents of 4M floats (16 MB), read from their packed bytes (element by element
    they held the loop 0.3-0.4 s: bench/loop_stalls.py), arrive intact."""
    x = np.random.default_rng(4).random((250_000, 16), dtype=np.float32)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(
        doubling.grpc_url, options=[("grpc.max_receive_message_length", 64 << 20)]))
    request = service_pb2.ModelInferRequest(model_name="double")
    tensor = request.inputs.add(name="X", datatype="FP32", shape=list(x.shape))
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    [raw] = stub.ModelInfer(request).raw_output_contents
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(x.shape), x * 2)


def test_answers_and_errors_are_those_of_the_loop(doubling: RunningServer) -> None:
    x = _x(2)
    client = httpclient.InferenceServerClient(doubling.url)
    request = httpclient.InferInput("X", list(x.shape), "FP32")
    request.set_data_from_numpy(x, binary_data=False)  # a large JSON body
    for binary in (True, False):
        wanted = httpclient.InferRequestedOutput("Y", binary_data=binary)
        result = client.infer("double", [request], outputs=[wanted])
        np.testing.assert_array_equal(result.as_numpy("Y"), x * 2)
    compressed = gzip.compress(_body(x, binary_output=True), 1)  # inflated on a thread
    reply = call(doubling.url, "POST", "/v2/models/double/infer", compressed,
                 {"Content-Encoding": "gzip"})
    assert reply.status == 200, reply.body[:300]
    json_length = int(reply.headers["inference-header-content-length"])
    np.testing.assert_array_equal(
        np.frombuffer(reply.body[json_length:], np.float32).reshape(ROWS, 16), x * 2)
    # a null at the end of 1.6M numbers: named, with its index, as on the loop
    data = x.ravel().tolist()
    data[-1] = None
    bad = orjson.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [ROWS, 16],
                                    "data": data}]})
    refused = call(doubling.url, "POST", "/v2/models/double/infer", bad)
    assert refused.status == 400, refused.body[:300]
    assert refused.error == ("input 'X': FP32 data must be numbers, got None (element "
                             f"{ROWS * 16 - 1})")


def _coder_pids(server: RunningServer) -> list[int]:
    """The server's helper processes (multiprocessing's spawned children)."""
    children = subprocess.run(["pgrep", "-P", str(server.process.pid)], capture_output=True,
                              text=True).stdout.split()
    return [int(pid) for pid in children
            if b"multiprocessing" in Path(f"/proc/{pid}/cmdline").read_bytes()
            and b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()]


def test_a_helper_process_that_died_is_replaced(doubling: RunningServer) -> None:
    x = _x(3)
    body = _body(x, binary_output=True)
    assert call(doubling.url, "POST", "/v2/models/double/infer", body).status == 200
    [coder] = _coder_pids(doubling)
    os.kill(coder, signal.SIGKILL)
    for _ in range(2):  # the first finds it gone and starts another
        reply = call(doubling.url, "POST", "/v2/models/double/infer", body)
        assert reply.status == 200, reply.body[:300]
    assert _coder_pids(doubling) not in ([], [coder])


TEXTS = 500_000  # parse_int's TEXT: BYTES [TEXTS, 1], "0".."9" cast to INT64


def _texts() -> tuple[np.ndarray, np.ndarray]:
    digits = np.random.default_rng(5).integers(0, 10, (TEXTS, 1))
    return digits.astype(str).astype(np.object_), digits


@pytest.mark.parametrize("form", ["http binary", "http json", "grpc raw", "grpc contents"])
def test_many_bytes_elements_decoded_off_the_loop(doubling: RunningServer, form: str) -> None:
    """500k BYTES elements, decoded on a thread (JSON: in the helper process, back as wire
    bytes; on the event loop they held it 0.4-0.9 s: bench/loop_stalls.py), arrive intact."""
    texts, digits = _texts()
    if form.startswith("http"):
        client = httpclient.InferenceServerClient(doubling.url, network_timeout=120)
        text = httpclient.InferInput("TEXT", list(texts.shape), "BYTES")
        text.set_data_from_numpy(texts, binary_data=form == "http binary")
        wanted = [httpclient.InferRequestedOutput("NUMBER", binary_data=True)]

        def ask() -> np.ndarray:
            return client.infer("parse_int", [text], outputs=wanted).as_numpy("NUMBER")
    else:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(
            doubling.grpc_url, options=[("grpc.max_receive_message_length", 64 << 20)]))
        request = service_pb2.ModelInferRequest(model_name="parse_int")
        tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=list(texts.shape))
        if form == "grpc raw":
            request.raw_input_contents.append(b"".join(
                len(t).to_bytes(4, "little") + t.encode() for t in texts.ravel()))
        else:
            tensor.contents.bytes_contents.extend(t.encode() for t in texts.ravel())

        def ask() -> np.ndarray:
            [raw] = stub.ModelInfer(request).raw_output_contents
            return np.frombuffer(raw, np.int64).reshape(texts.shape)
    np.testing.assert_array_equal(ask(), digits)
