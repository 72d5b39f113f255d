"""The v2 REST surface over a real server: health, metadata, config, stats, metrics, errors."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import RunningServer
from tests.integration.http_helpers import call, infer, metric

pytestmark = pytest.mark.integration

LINEAR_INPUT = {"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}


def test_health_and_server_metadata(server: RunningServer) -> None:
    assert call(server.url, "GET", "/v2/health/live").status == 200
    assert call(server.url, "GET", "/v2/health/ready").status == 200
    metadata = call(server.url, "GET", "/v2").json()
    assert metadata["name"] == "serval"
    assert "binary_tensor_data" in metadata["extensions"]


def test_model_metadata_reads_the_model_file(server: RunningServer) -> None:
    metadata = call(server.url, "GET", "/v2/models/linear").json()
    assert metadata == {
        "name": "linear", "versions": ["1"], "platform": "onnxruntime_onnx",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 4]}],
    }
    assert call(server.url, "GET", "/v2/models/linear/versions/1").json() == metadata


def test_model_readiness(server: RunningServer) -> None:
    assert call(server.url, "GET", "/v2/models/linear/ready").json() == {
        "name": "linear", "ready": True}
    broken = call(server.url, "GET", "/v2/models/corrupt/ready")  # not ready: 400, as Triton
    assert broken.status == 400 and broken.json()["ready"] is False
    for unknown in ("/v2/models/nope/ready", "/v2/models/linear/versions/99/ready"):
        assert call(server.url, "GET", unknown).status == 400


def test_model_config_shows_batching(server: RunningServer) -> None:
    config = call(server.url, "GET", "/v2/models/linear/config").json()
    assert config["max_batch_size"] == 32
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [8]}]
    fixed = call(server.url, "GET", "/v2/models/fixed/config").json()
    assert fixed["max_batch_size"] == 0 and fixed["input"][0]["dims"] == [2, 3]


def test_json_inference_computes_the_model(server: RunningServer) -> None:
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    reply = infer(server.url, "linear", {
        "id": "req-7",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8], "data": x.ravel().tolist()}],
    })
    assert reply.status == 200, reply.body
    doc = reply.json()
    assert doc["id"] == "req-7" and doc["model_name"] == "linear" and doc["model_version"] == "1"
    (output,) = doc["outputs"]
    assert output["shape"] == [2, 4] and output["datatype"] == "FP32"
    rows = np.asarray(output["data"], dtype=np.float32).reshape(2, 4)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, rtol=1e-5)


def test_binary_output_on_request(server: RunningServer) -> None:
    reply = infer(server.url, "linear", {
        "inputs": [LINEAR_INPUT], "parameters": {"binary_data_output": True}})
    assert reply.status == 200
    header_length = int(reply.headers["inference-header-content-length"])
    doc = __import__("orjson").loads(reply.body[:header_length])
    size = doc["outputs"][0]["parameters"]["binary_data_size"]
    assert size == 16 and len(reply.body) == header_length + size
    values = np.frombuffer(reply.body[header_length:], dtype="<f4")
    assert abs(float(values.sum()) - 1.0) < 1e-5


def test_statistics_count_inferences(server: RunningServer) -> None:
    before = call(server.url, "GET", "/v2/models/add_sub/stats").json()["model_stats"][0]
    doc = {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [3, 16], "data": [1.0] * 48},
        {"name": "INPUT1", "datatype": "FP32", "shape": [3, 16], "data": [2.0] * 48}]}
    assert infer(server.url, "add_sub", doc).status == 200
    after = call(server.url, "GET", "/v2/models/add_sub/stats").json()["model_stats"][0]
    assert after["inference_count"] == before["inference_count"] + 3
    assert after["execution_count"] == before["execution_count"] + 1
    success = after["inference_stats"]["success"]
    assert success["count"] == before["inference_stats"]["success"]["count"] + 1
    assert success["ns"] > 0
    every = call(server.url, "GET", "/v2/models/stats").json()["model_stats"]
    assert {"add_sub", "linear", "corrupt"} <= {entry["name"] for entry in every}


def test_statistics_of_an_unknown_model_is_an_error(server: RunningServer) -> None:
    """As Triton: "requested model 'X' is not available", not an empty list."""
    reply = call(server.url, "GET", "/v2/models/nope/stats")
    assert reply.status == 404 and reply.error == "requested model 'nope' is not available"
    long = call(server.url, "GET", f"/v2/models/{'n' * 200}/stats")
    assert long.status == 404 and len(long.error) < 100  # the name is quoted shortened


@pytest.mark.parametrize(("version", "status"), [("9" * 5000, 404), ("0" * 5000, 400)])
def test_a_version_string_of_any_length_is_a_precise_4xx(server: RunningServer, version: str,
                                                          status: int) -> None:
    """Past 4,300 digits Python's int() refuses to convert (it was a 500 and a traceback); the
    message quotes the version cut short."""
    for action in ("", "/stats", "/config"):  # (/ready answers {"ready": false})
        reply = call(server.url, "GET", f"/v2/models/add_sub/versions/{version}{action}")
        assert reply.status == status, (action, reply.status, reply.body[:200])
        assert "version" in reply.error and len(reply.error) < 300


def test_prometheus_metrics(server: RunningServer) -> None:
    assert infer(server.url, "linear", {"inputs": [LINEAR_INPUT]}).status == 200
    text = call(server.url, "GET", "/metrics").body.decode()
    for family in ("serval_requests_total", "serval_executions_total",
                   "serval_batch_size_bucket", "serval_queue_duration_seconds_bucket",
                   "serval_compute_duration_seconds_bucket",
                   "serval_request_duration_seconds_bucket", "serval_model_memory_bytes",
                   "serval_pending_requests", "serval_running_batches",
                   "process_resident_memory_bytes"):
        assert family in text, family
    assert 'serval_requests_total{model="linear",outcome="success",version="1"}' in text
    assert 'serval_model_ready{model="corrupt",version="1"} 0.0' in text


def test_metrics_show_the_transports_connections_and_receive_budget(
        server: RunningServer) -> None:
    import socket

    held = [socket.create_connection(("127.0.0.1", server.port))
            for _ in range(3)]
    try:
        for sock in held:  # each one answered: admitted and counted
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        assert metric(server.url, "serval_connections_open") >= 4  # and the scrape's own
        assert metric(server.url, "serval_connections_limit") >= 64
        assert metric(server.url, "serval_receive_budget_bytes") == 192 * 2**20
        assert metric(server.url, "serval_receive_budget_held_bytes") < 192 * 2**20
    finally:
        for sock in held:
            sock.close()


BAD_INPUTS = [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"inputs": []}', "non-empty 'inputs'"),
    ({"inputs": [{"name": "x", "datatype": "FP99", "shape": [1, 8], "data": [0] * 8}]},
     "unknown datatype 'FP99'"),
    ({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 8], "data": [0] * 8}]},
     "datatype INT32 given, model expects FP32"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 7], "data": [0] * 7}]},
     "shape [1, 7] given, model expects [-1, 8]"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0] * 5}]},
     "needs 8 elements"),
    ({"inputs": [{"name": "y", "datatype": "FP32", "shape": [1, 8], "data": [0] * 8}]},
     "has no input 'y'; expected inputs: x (FP32 [-1, 8])"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [33, 8], "data": [0] * 264}]},
     "batch size 33 given, model accepts 1 to 32"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": ["a"] * 8}]},
     "data must be numbers"),
    ({"inputs": [LINEAR_INPUT], "outputs": [{"name": "nope"}]}, "has no output 'nope'"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8]}]}, "neither 'data'"),
    # wrong JSON types: never read as their truth value (Triton refuses them too)
    ({"inputs": [LINEAR_INPUT], "parameters": {"binary_data_output": "false"}},
     "request parameter 'binary_data_output' must be a JSON boolean (true or false), "
     "got 'false'"),
    ({"inputs": [LINEAR_INPUT], "outputs": [{"name": "y", "parameters": {"binary_data": "no"}}]},
     "output 'y' parameter 'binary_data' must be a JSON boolean"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8],
                  "data": [True] + [0.5] * 7}]}, "FP32 data must be numbers, got True (element 0)"),
]


@pytest.mark.parametrize(("body", "message"), BAD_INPUTS)
def test_bad_input_is_a_precise_400(server: RunningServer, body: object, message: str) -> None:
    reply = infer(server.url, "linear", body)
    assert reply.status == 400, reply.body
    assert message in reply.error
    assert infer(server.url, "linear", {"inputs": [LINEAR_INPUT]}).status == 200


def test_missing_input_names_what_is_needed(server: RunningServer) -> None:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": [0] * 16}]}
    reply = infer(server.url, "add_sub", doc)
    assert reply.status == 400 and "needs input 'INPUT1' (FP32 [-1, 16])" in reply.error


def test_bad_binary_bodies_are_400(server: RunningServer) -> None:
    header = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,8],' \
             b'"parameters":{"binary_data_size":32}}]}'
    short = infer(server.url, "linear", header + b"\0" * 8,
                  {"Inference-Header-Content-Length": str(len(header))})
    assert short.status == 400 and "only 8 bytes of binary data remain" in short.error
    too_long = infer(server.url, "linear", header,
                     {"Inference-Header-Content-Length": str(len(header) + 10)})
    assert too_long.status == 400 and "Inference-Header-Content-Length" in too_long.error
    not_int = infer(server.url, "linear", header, {"Inference-Header-Content-Length": "abc"})
    assert not_int.status == 400 and "must be a non-negative integer" in not_int.error


def test_gzip_request_bodies(server: RunningServer) -> None:
    import gzip

    import orjson

    body = gzip.compress(orjson.dumps({"inputs": [LINEAR_INPUT]}))
    assert infer(server.url, "linear", body, {"Content-Encoding": "gzip"}).status == 200
    bad = infer(server.url, "linear", b"garbage", {"Content-Encoding": "gzip"})
    assert bad.status == 400 and "not valid gzip" in bad.error


def test_not_found_and_wrong_method(server: RunningServer) -> None:
    unknown = infer(server.url, "nope", {"inputs": [LINEAR_INPUT]})
    assert unknown.status == 404
    assert "Request for unknown model: 'nope' is not found" in unknown.error
    version = call(server.url, "GET", "/v2/models/linear/versions/9")
    assert version.status == 404 and "version 9 is not found" in version.error
    assert call(server.url, "GET", "/v2/nothing/here").status == 404
    # a 405 says what the route takes (RFC 9110 15.5.6: Allow)
    for method, path, allow in (("GET", "/v2/models/linear/infer", "POST"),
                                ("POST", "/v2/models/linear", "GET, HEAD"),
                                ("DELETE", "/v2/health/live", "GET, HEAD"),
                                ("PUT", "/v2/logging", "GET, POST, HEAD"),
                                ("GET", "/v2/repository/index", "POST"),
                                ("GET", "/v2/systemsharedmemory/region/x/register", "POST"),
                                ("POST", "/status", "GET, HEAD"),
                                ("POST", "/ui", "GET, HEAD")):
        refused = call(server.url, method, path, b"{}" if method != "GET" else None)
        assert (refused.status, refused.headers.get("allow")) == (405, allow), (method, path)


@pytest.mark.parametrize(("body", "headers"), [
    (b"", {}), (b"{not json", {}), (b'{"inputs": 3}', {}), (b"\0" * 8, {}),
    (b"garbage", {"Content-Encoding": "gzip"}),
])
@pytest.mark.parametrize("path", ["/v2/models/nope/infer", "/v2/models/linear/versions/9/infer"])
def test_an_unknown_model_is_404_whatever_the_body(server: RunningServer, path: str,
                                                   body: bytes, headers: dict[str, str]) -> None:
    """The model is looked up before the body is read as a request (it is 400 for `linear`)."""
    reply = call(server.url, "POST", path, body, headers)
    assert reply.status == 404, reply.body
    assert ("Request for unknown model: 'nope' is not found" in reply.error
            or "version 9 is not found" in reply.error)
    assert call(server.url, "POST", "/v2/models/linear/infer", body, headers).status == 400


def test_model_that_failed_to_load_is_503_and_others_serve(server: RunningServer) -> None:
    reply = infer(server.url, "corrupt", {"inputs": [LINEAR_INPUT]})
    assert reply.status == 503 and "load failed" in reply.error
    assert infer(server.url, "linear", {"inputs": [LINEAR_INPUT]}).status == 200


def test_engine_failure_is_a_generic_500_with_request_id(server: RunningServer) -> None:
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 4], "data": [1.0] * 8}]}
    reply = infer(server.url, "first_row", doc)
    assert reply.status == 500
    assert "request id" in reply.error and "rows" not in reply.error
    request_id = reply.error.split("request id ")[1].split(";")[0]
    assert request_id in server.log() and "returned 1 rows" in server.log()
    ok = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]}
    assert infer(server.url, "first_row", ok).status == 200


def test_model_without_batch_axis_serves_its_fixed_shape(server: RunningServer) -> None:
    doc = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2, 3],
                       "data": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]}]}
    reply = infer(server.url, "fixed", doc)
    assert reply.status == 200, reply.body
    (output,) = reply.json()["outputs"]
    assert output["shape"] == [2, 3] and output["data"] == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]


@pytest.mark.skipif(__import__("onnxruntime").get_device() == "GPU", reason="CPU-only check")
def test_cuda_model_on_a_cpu_machine_fails_its_load_clearly(
    server_factory: object, tmp_path: __import__("pathlib").Path
) -> None:
    from tests import fixture_models

    fixture_models.linear(tmp_path, config="max_batch_size: 8\ndevice: cuda\n")
    fixture_models.add_sub(tmp_path)
    server = server_factory(tmp_path)  # type: ignore[operator]
    reply = call(server.url, "GET", "/v2/models/linear/ready")
    assert reply.status == 400
    failed = infer(server.url, "linear", {"inputs": [LINEAR_INPUT]})
    assert failed.status == 503 and "CUDA is not available" in failed.error
    doc = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}
                      for n in ("INPUT0", "INPUT1")]}
    assert infer(server.url, "add_sub", doc).status == 200


@pytest.mark.parametrize(("body", "message"), [
    (b'{"ready": "false"}', "repository index 'ready' must be a JSON boolean (true or false), "
                            "got 'false'"),
    (b'{"ready": 1}', "'ready' must be a JSON boolean"),
    (b'{"parameters": []}', "'parameters' must be a JSON object, got []"),
])
def test_repository_options_of_the_wrong_type_are_a_400(server: RunningServer, body: bytes,
                                                        message: str) -> None:
    reply = call(server.url, "POST", "/v2/repository/index", body)
    assert reply.status == 400 and message in reply.error, reply.body
    ready = call(server.url, "POST", "/v2/repository/index", b'{"ready": true}')
    assert ready.status == 200 and all(model["state"] == "READY" for model in ready.json())

