"""Clients that ask for large answers and read none of them (HTTP/1.1), or grant them no
flow-control window (HTTP/2): the server holds at most its receive budget's worth of unsent
answers (plus one), closing the connections stalled longest, instead of every answer until
each connection's write-stall timeout."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pytest
from onnx import TensorProto, helper, save
from tritonclient.grpc import service_pb2

from serval.http2 import frames as h2
from tests.conftest import RunningServer
from tests.integration.http_helpers import call, metric
from tests.security.h2_helpers import RawH2, data, headers, message

pytestmark = pytest.mark.integration
MIB = 1 << 20
ANSWER_BYTES = 8 * MIB  # the answer to a ~100-byte request (the kernel takes ~3 MB of it)
BODY = orjson.dumps({"inputs": [{"name": "n", "datatype": "INT64", "shape": [1],
                                 "data": [ANSWER_BYTES // 4]}],
                     "parameters": {"binary_data_output": True}})


def _amplifier(root: Path) -> Path:
    """`zeros`: INT64 [1] n -> FP32 [n] of zeros (ConstantOfShape)."""
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["n"], ["zeros"],
                          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0]))],
        "zeros", [helper.make_tensor_value_info("n", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("zeros", TensorProto.FLOAT, ["n"])])
    folder = root / "zeros" / "1"
    folder.mkdir(parents=True)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
         str(folder / "model.onnx"))
    (root / "zeros" / "config.yaml").write_text("backend: onnxruntime\nmax_batch_size: 0\n")
    return root


@pytest.fixture(scope="module")
def amplifying(server_factory: Callable[..., RunningServer],
               tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    return server_factory(_amplifier(tmp_path_factory.mktemp("backlog")),
                          "--receive-budget-mb", "8")


def _ask_and_never_read(server: RunningServer) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the server's bytes wait
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(b"POST /v2/models/zeros/infer HTTP/1.1\r\nhost: x\r\ncontent-length: "
                 + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)
    return sock


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _read_answer(sock: socket.socket) -> tuple[int, int | None]:
    """The answer's body bytes the server sent before the connection ended (a reset ends it
    too), reading no further than its content-length; and that length (None: no head)."""
    sock.settimeout(30)
    data, wanted = b"", None
    try:
        while wanted is None or len(data) < wanted:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
            if wanted is None and b"\r\n\r\n" in data:
                head, _, data = data.partition(b"\r\n\r\n")
                length = [line for line in head.lower().split(b"\r\n")
                          if line.startswith(b"content-length:")]
                wanted = int(length[0].split(b":")[1])
    except ConnectionResetError:
        pass
    return (len(data) if wanted is not None else 0), wanted


def test_unread_answers_are_bounded_by_the_receive_budget(amplifying: RunningServer) -> None:
    """Before, six connections each held the 5 MiB of its 8 MiB answer the kernel did not
    take, until the write-stall timeout (the backlog had no bound but the connection limit:
    10,000 x 5 MiB). Now past 8 MiB (the receive budget) the connections stalled longest are
    closed at once, and the newest keeps its answer."""
    url = amplifying.url
    closed_before = metric(url, 'serval_connections_closed_total{reason="send backlog"}', 0)
    sockets = []
    closes = 'serval_connections_closed_total{reason="send backlog"}'
    for index in range(6):
        held, closed = metric(url, "serval_send_backlog_bytes", 0), metric(url, closes, 0)
        sockets.append(_ask_and_never_read(amplifying))
        _wait_for(lambda held=held, closed=closed: metric(url, "serval_send_backlog_bytes", 0)
                  != held or metric(url, closes, 0) > closed,
                  f"connection {index}'s answer stalls")
        assert metric(url, "serval_send_backlog_bytes", 0) <= 8 * MIB + ANSWER_BYTES
    assert metric(url, closes, 0) - closed_before >= 4
    got, length = _read_answer(sockets[0])
    assert length is None or got < length  # the one stalled longest was cut off
    got, length = _read_answer(sockets[-1])
    assert length is not None and length > ANSWER_BYTES and got == length  # the newest: whole
    for sock in sockets:
        sock.close()
    _wait_for(lambda: metric(url, "serval_send_backlog_bytes", 0) == 0, "the backlog empties")
    assert call(url, "GET", "/v2/health/ready").status == 200


def _zeros_request(stream_id: int) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="zeros")
    request.inputs.add(name="n", datatype="INT64", shape=[1])
    request.raw_input_contents.append(np.array([ANSWER_BYTES // 4], np.int64).tobytes())
    return headers(stream_id) + data(stream_id, message(request.SerializeToString()), True)


def test_an_http2_client_granting_no_window_cannot_pile_up_answers(
        amplifying: RunningServer) -> None:
    """A gRPC client whose streams grant no window keeps every reply queued in the server: on
    one connection, three 8 MiB answers stayed until the send timeout. Past the receive
    budget (8 MiB) with several answers the connection is aborted, and the backlog empties."""
    url = amplifying.url
    closes = 'serval_connections_closed_total{reason="send backlog"}'
    closed_before = metric(url, closes, 0)
    with RawH2(amplifying.grpc_port, settings={h2.INITIAL_WINDOW_SIZE: 0}) as attacker:
        for stream_id in (1, 3, 5):
            attacker.send(_zeros_request(stream_id))
        attacker.closed_with(30)
    assert metric(url, closes, 0) == closed_before + 1
    _wait_for(lambda: metric(url, "serval_send_backlog_bytes", 0) == 0, "the backlog empties")
    assert call(url, "GET", "/v2/health/ready").status == 200
