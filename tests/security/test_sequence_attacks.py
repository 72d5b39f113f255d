"""Attacks on sequence batching (Triton's sequence_batcher) on a real server, over HTTP and
gRPC: correlation ids a CORRID control cannot carry, ids of any size, and a model that must
keep serving every other client's sequences after each."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.conftest import RunningServer
from tests.integration.http_helpers import infer, wait_until_idle, wait_until_queued
from tests.triton_examples import write_model

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.integration

TRANSPORTS = ["http", "grpc"]
BAD = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
ONE = np.ones((1, 1), np.int32)
CORRID_TYPES = {"INT32": TensorProto.INT32, "UINT32": TensorProto.UINT32,
                "INT64": TensorProto.INT64}


def _control(name: str, kind: str) -> str:
    return (f'  {{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} '
            "int32_false_true: [ 0, 1 ] } ] }")


def _corrid_model(root: Path, datatype: str) -> None:
    """corrid_<type>: OUTPUT = INPUT + START, plus the CORRID (cast to INT32) on the END step;
    its CORRID control is `datatype`."""
    name = f"corrid_{datatype.lower()}"
    io = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1])
          for n in ("INPUT", "START", "END", "OUTPUT")]
    corrid = helper.make_tensor_value_info("CORRID", CORRID_TYPES[datatype], ["batch", 1])
    nodes = [helper.make_node("Cast", ["CORRID"], ["corrid"], to=TensorProto.INT32),
             helper.make_node("Mul", ["END", "corrid"], ["last"]),
             helper.make_node("Add", ["INPUT", "START"], ["sum"]),
             helper.make_node("Add", ["sum", "last"], ["OUTPUT"])]
    graph = helper.make_graph(nodes, name, [*io[:3], corrid], [io[3]])
    controls = ",\n".join([_control("START", "START"), _control("END", "END"),
                           f'  {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID '
                           f"data_type: TYPE_{datatype} }} ] }}"])
    config = (f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
              "sequence_batching {\n  max_sequence_idle_microseconds: 5000000\n"
              f"  control_input [\n{controls}\n  ]\n}}\n"
              'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
              'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    write_model(root, name, graph, config)


def _plain_model(root: Path) -> None:
    """plain: OUTPUT = INPUT + START, no CORRID (any id, integer or string, will do)."""
    io = [helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1])
          for n in ("INPUT", "START", "OUTPUT")]
    graph = helper.make_graph([helper.make_node("Add", ["INPUT", "START"], ["OUTPUT"])],
                              "plain", io[:2], io[2:])
    config = ('name: "plain"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n'
              "sequence_batching {\n  max_sequence_idle_microseconds: 5000000\n"
              f"  control_input [\n{_control('START', 'START')}\n  ]\n}}\n"
              'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
              'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    write_model(root, "plain", graph, config)


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer],
           tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root = tmp_path_factory.mktemp("sequence-attacks")
    for datatype in CORRID_TYPES:
        _corrid_model(root, datatype)
    _plain_model(root)
    return server_factory(root)


def _client(server: RunningServer, transport: str) -> Any:
    if transport == "http":
        return httpclient.InferenceServerClient(server.url, network_timeout=20.0)
    return grpcclient.InferenceServerClient(server.grpc_url)


def _step(client: Any, transport: str, model: str, value: int = 1, **sequence: Any) -> int:
    module = httpclient if transport == "http" else grpcclient
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
    extra = {"client_timeout": 20.0} if transport == "grpc" else {}
    result = client.infer(model, [tensor], **sequence, **extra)
    return int(result.as_numpy("OUTPUT").flat[0])


def _refused(call: Callable[[], object], transport: str, *words: str) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    message = str(caught.value.message())
    assert str(caught.value.status()) == BAD[transport], message
    for word in words:
        assert word in message, message
    return message


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(("datatype", "too_big"), [("INT32", 2**31), ("UINT32", 2**32),
                                                   ("INT64", 2**63)])
def test_an_id_its_corrid_cannot_carry_is_refused_and_the_model_serves_on(
        server: RunningServer, transport: str, datatype: str, too_big: int) -> None:
    """A sequence id past the CORRID control's range was accepted, then failed to convert in
    the consumer task, which died: every later request of the model hung for ever."""
    if transport == "grpc" and too_big >= 2**63:
        pytest.skip("tritonclient sends an integer id as int64_param")
    client = _client(server, transport)
    model = f"corrid_{datatype.lower()}"
    _refused(lambda: _step(client, transport, model, sequence_id=too_big,
                           sequence_start=True), transport,
             str(too_big), datatype, str(too_big - 1))
    largest = too_big - 1  # the top of the range is fine (its low bits reach OUTPUT)
    _step(client, transport, model, sequence_id=largest, sequence_start=True,
          sequence_end=True)
    assert _step(client, transport, model, 5, sequence_id=7, sequence_start=True) == 6
    assert _step(client, transport, model, 5, sequence_id=7, sequence_end=True) == 12


def test_a_huge_string_id_is_refused_without_echoing_it(server: RunningServer) -> None:
    """A 1 MB string id was taken, kept in the live table (and 4096 of them among the
    expired ids, 4 GiB) and echoed whole in errors."""
    huge = "x" * (1 << 20)
    for flags in ({"sequence_start": True}, {}):
        doc = {"parameters": {"sequence_id": huge, **flags},
               "inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1],
                           "data": [1]}]}
        reply = infer(server.url, "plain", doc)
        assert reply.status == 400, reply.body[:200]
        assert len(reply.body) < 1000
        assert "sequence_id" in reply.error and "1024 bytes" in reply.error, reply.error
    client = _client(server, "grpc")
    _refused(lambda: _step(client, "grpc", "plain", sequence_id="é" * 513,
                           sequence_start=True), "grpc", "1024 bytes")
    longest = "é" * 512  # 1024 bytes of UTF-8
    assert _step(client, "grpc", "plain", sequence_id=longest, sequence_start=True,
                 sequence_end=True) == 2


def _fill_plain(server: RunningServer, first_id: int) -> list[int]:
    """Start sequences until every one of plain's 4 slots is held; their ids."""
    client = _client(server, "http")
    ids = list(range(first_id, first_id + 4))
    for sequence_id in ids:
        _step(client, "http", "plain", sequence_id=sequence_id, sequence_start=True)
    return ids


def _end_all(server: RunningServer, ids: list[int]) -> None:
    """End the sequences (those that idled out on a slow box are gone already)."""
    client = _client(server, "http")
    for sequence_id in ids:
        try:
            _step(client, "http", "plain", sequence_id=sequence_id, sequence_end=True)
        except InferenceServerException as exc:
            assert "idle" in str(exc.message()), exc.message()
    wait_until_idle(server.url, "plain")


def test_steps_behind_a_start_its_client_cancelled_fail_at_once(server: RunningServer) -> None:
    """A START waiting for a slot, cancelled by its client (gRPC), left the steps queued
    behind it waiting on a future nobody would ever settle: they hung for ever, each holding
    one of the server's in-flight places."""
    held = _fill_plain(server, 1000)
    try:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        start = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        start.set_data_from_numpy(ONE)
        call = client.async_infer("plain", [start], callback=lambda *_: None,
                                  sequence_id=2000, sequence_start=True)
        wait_until_queued(server.url, "plain", 1, timeout_s=10)
        answer: dict[str, Any] = {}

        def follow() -> None:
            try:
                _step(_client(server, "http"), "http", "plain", sequence_id=2000)
            except InferenceServerException as exc:
                answer["error"] = exc

        follower = threading.Thread(target=follow)
        follower.start()
        wait_until_queued(server.url, "plain", 2, timeout_s=10)
        call.cancel()
        follower.join(30)
        error = answer["error"]
        assert str(error.status()) == "400", error.message()
        assert "2000" in error.message() and "cancelled" in error.message()
        wait_until_queued(server.url, "plain", 0, timeout_s=10)
    finally:
        _end_all(server, held)


def test_an_id_past_64_bits_in_json_gets_the_id_range(server: RunningServer) -> None:
    """An integer id past 2**64 - 1 (JSON reads it as a float) was refused as 'not float'."""
    body = (b'{"parameters":{"sequence_id":18446744073709551616,"sequence_start":true},'
            b'"inputs":[{"name":"INPUT","datatype":"INT32","shape":[1,1],"data":[1]}]}')
    reply = infer(server.url, "plain", body)
    assert reply.status == 400
    assert "18446744073709551615" in reply.error, reply.error


def test_an_unload_fails_the_starts_waiting_for_a_slot_at_once(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    """The registry retires the version before waiting for its in-flight requests: a START
    waiting for one of the full table's slots counted as one, so the unload waited until an
    idle sequence expired (here 10 minutes; the HTTP unload call gives up after 20 s)."""
    _plain_model(tmp_path)
    config = tmp_path / "plain" / "config.pbtxt"
    config.write_text(config.read_text().replace("5000000", "600000000"))
    server = server_factory(tmp_path, "--model-control", "explicit", "--load-model", "plain")
    _fill_plain(server, 1)
    answer: dict[str, Any] = {}

    def start() -> None:
        try:
            _step(_client(server, "http"), "http", "plain", sequence_id=99, sequence_start=True)
        except InferenceServerException as exc:
            answer["error"] = exc

    waiting = threading.Thread(target=start)
    waiting.start()
    wait_until_queued(server.url, "plain", 1, timeout_s=10)
    httpclient.InferenceServerClient(server.url, network_timeout=20.0).unload_model("plain")
    waiting.join(20)
    error = answer["error"]
    assert str(error.status()) == "503", error.message()
