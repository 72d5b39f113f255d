"""Hostile and slow clients of the streaming paths (gRPC ModelStreamInfer, generate_stream) on a
real server: what a decoupled model may hold for a client that does not read, and that the
next client is served."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.conftest import RunningServer
from tests.triton_python_models import write, write_pbtxt

pytestmark = pytest.mark.integration

WAIT_S = 60.0
STREAM_WINDOW, MIN_WINDOW = 128, 2  # as server/grpc/stream_infer.py lends them

# N responses of SIZE bytes each, sent from a thread per request as fast as the sender takes
# them; every send counted in one file (the total of all requests), `done-ID` once it ends.
FLOOD = '''
import threading
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = Path(args["model_repository"])
        self.lock = threading.Lock()
        self.sent = 0

    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            size = int(pb_utils.get_input_tensor_by_name(request, "SIZE").as_numpy()[0])
            threading.Thread(target=self.respond, daemon=True, args=(
                request.request_id(), request.get_response_sender(), n, size)).start()
        return None

    def respond(self, request_id, sender, n, size):
        payload = np.zeros([size], np.uint8)
        for _ in range(n):
            if sender.is_cancelled():
                break
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", payload)]))
            with self.lock:
                self.sent += 1
                (self.folder / "sent.new").write_text(str(self.sent))
                (self.folder / "sent.new").replace(self.folder / "sent")  # never read half
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        (self.folder / ("done-" + request_id)).write_text("")
'''

FLOOD_PBTXT = """\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "SIZE" data_type: TYPE_INT32 dims: [ 1 ] }}
]
output [ {{ name: "OUT" data_type: TYPE_UINT8 dims: [ -1 ] }} ]
"""


# execute() starts a thread that sends until its request is cancelled (then `stopped-ID`),
# then raises: the request fails, and the thread must learn it is over
ABANDONS = '''
import http.client
import json
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = Path(args["model_repository"])

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.respond, daemon=True, args=(
                request.request_id(), request.get_response_sender())).start()
        raise pb_utils.TritonModelException("execute() gives up")

    def respond(self, request_id, sender):
        sent = 0
        while not sender.is_cancelled() and sent < 20000:
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.zeros([1], np.uint8))]))
            sent += 1
            time.sleep(0.001)
        if sender.is_cancelled():
            (self.folder / ("stopped-" + request_id)).write_text(str(sent))
'''


# Serval's own decoupled model, yielding an output its config does not declare, by N: a list,
# a string, None, an FP64 array (its config says INT32)
MISTYPED = '''
import numpy as np


class Model:
    def load(self, ctx):
        pass

    def infer(self, inputs):
        yield {"OUT": [[1, 2], "text", None, np.zeros([2], np.float64)][int(inputs["N"][0])]}
'''

# Serval's own decoupled model: N responses of SIZE bytes, yielded as fast as they are taken;
# `closed-SIZE` beside it once the generator is closed
GENERATOR = '''
from pathlib import Path

import numpy as np


class Model:
    def load(self, ctx):
        pass

    def infer(self, inputs):
        size = int(inputs["SIZE"][0])
        payload = np.zeros([size], np.uint8)
        try:
            for _ in range(int(inputs["N"][0])):
                yield {"OUT": payload}
        finally:
            (Path(__file__).parent / f"closed-{size}").write_text("")
'''

GENERATOR_CONFIG = """\
backend: python
max_batch_size: 0
inputs:
  - {name: N, datatype: INT32, dims: [1]}
  - {name: SIZE, datatype: INT32, dims: [1]}
outputs:
  - {name: OUT, datatype: UINT8, dims: [-1]}
"""

MISTYPED_CONFIG = GENERATOR_CONFIG.replace("datatype: UINT8", "datatype: INT32")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stream-attacks")
    write_pbtxt(root, "flood", FLOOD, FLOOD_PBTXT)
    write_pbtxt(root, "abandons", ABANDONS, FLOOD_PBTXT)
    write(root, "mistyped", MISTYPED, MISTYPED_CONFIG)
    write(root, "generator", GENERATOR, GENERATOR_CONFIG)
    write(root, "generator_process", GENERATOR, GENERATOR_CONFIG + "isolation: process\n")
    return root


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer], repository: Path) -> RunningServer:
    return server_factory(repository, "--allow-python-models")


def _flood_request(request_id: str, n: int, size: int, model: str = "flood"
                   ) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, value in (("N", n), ("SIZE", size)):
        request.inputs.add(name=name, datatype="INT32", shape=[1])
        request.raw_input_contents.append(np.array([value], np.int32).tobytes())
    return request


def _channel(server: RunningServer) -> grpc.Channel:
    # no BDP probing: the client's receive window stays 64 KiB, so a client that does not
    # read takes next to nothing off the server
    return grpc.insecure_channel(server.grpc_url, options=[
        ("grpc.http2.bdp_probe", 0), ("grpc.max_receive_message_length", -1)])


def _count(path: Path) -> int:
    text = path.read_text() if path.exists() else ""
    return int(text) if text else 0


def _settled(path: Path, bound: int) -> int:
    """The count in `path` once it stops growing (unchanged for a second after the first
    count: a loaded box may take that long to write it), failing as soon as it passes
    `bound`."""
    deadline = time.monotonic() + WAIT_S
    last, since = -1, time.monotonic()
    while last <= 0 or time.monotonic() - since < 1.0:
        assert time.monotonic() < deadline, f"still growing after {WAIT_S} s: {last}"
        count = _count(path)
        assert count <= bound, f"{count} responses sent to a client that reads none"
        if count != last:
            last, since = count, time.monotonic()
        time.sleep(0.05)
    return last


@pytest.fixture
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    opened = _channel(server)
    yield opened
    opened.close()


def _stream(channel: grpc.Channel, requests: list[service_pb2.ModelInferRequest],
            release: threading.Event, timeout_s: float = WAIT_S) -> Any:
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    def sent() -> Iterator[service_pb2.ModelInferRequest]:
        yield from requests
        release.wait(WAIT_S)  # the stream stays open until the test is done with it

    return stub.ModelStreamInfer(sent(), timeout=timeout_s)


def test_a_stream_of_decoupled_requests_that_reads_nothing_holds_one_budget(
        server: RunningServer, repository: Path, channel: grpc.Channel) -> None:
    """128 requests on one stream, each for 200 responses of 20 kB, none read: the model may
    send the stream's window budget and each request's minimum, no more (before: 64 each,
    8,320 responses held for the client, 877 MB at 100 kB)."""
    sent_file = repository / "flood" / "sent"
    requests = 128
    release = threading.Event()
    responses = _stream(channel, [_flood_request(f"r{i}", 200, 20_000)
                                  for i in range(requests)], release)
    try:
        first = next(responses)
        assert first.infer_response.id.startswith("r") and not first.error_message
        # each request's window and the one taken to be sent; the gRPC and socket buffers
        bound = STREAM_WINDOW + requests * (MIN_WINDOW + 1) + 128
        held = _settled(sent_file, bound)
        assert held >= requests  # every request ran: none was starved of a window
    finally:
        release.set()
        channel.close()
    # the client gone, every request is cancelled in the model, and the next client is served
    for index in range(requests):
        _wait_for(repository / "flood" / f"done-r{index}")
    with _channel(server) as fresh:
        release = threading.Event()
        ids = []
        for answer in _stream(fresh, [_flood_request("next", 3, 10)], release):
            assert not answer.error_message
            ids.append(answer.infer_response.id)
            if len(ids) == 3:
                break
        release.set()
    assert ids == ["next"] * 3


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def test_a_request_whose_execute_raised_is_cancelled_in_the_model(
        server: RunningServer, repository: Path, channel: grpc.Channel) -> None:
    """execute() raised after handing the request's sender to a thread: the client gets the
    error as the request's last response, and the thread sees is_cancelled() (before: the
    sender stayed open, the thread sent on for ever into a stream nobody routed)."""
    release = threading.Event()
    responses = _stream(channel, [_flood_request("gives-up", 1, 1, "abandons")], release)
    try:
        for answer in responses:
            if answer.error_message:
                break
        assert answer.error_message  # (a BackendError: its text is in the server log)
        assert answer.infer_response.id == "gives-up"
        _wait_for(repository / "abandons" / "stopped-gives-up")
    finally:
        release.set()


@pytest.mark.parametrize(("mode", "got"), [(0, "list"), (1, "str"), (2, "NoneType"),
                                           (3, "FP64 array")])
def test_a_generator_yielding_an_undeclared_output_fails_precisely(
        server: RunningServer, channel: grpc.Channel, mode: int, got: str) -> None:
    """Before: a list, string or None reached the encoders (INTERNAL / HTTP 500, a traceback
    in the log), an FP64 array went out as FP64 to clients told INT32."""
    expected = (f"infer() yielded output 'OUT' as a {got}; its config says a numpy array of "
                "INT32")
    logged = len(server.log())
    release = threading.Event()
    try:
        answer = next(_stream(channel, [_flood_request(f"m{mode}", mode, 1, "mistyped")],
                              release))
    finally:
        release.set()
    assert expected in answer.error_message
    assert answer.infer_response.id == f"m{mode}"
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=WAIT_S)
    connection.request("POST", "/v2/models/mistyped/generate_stream",
                       json.dumps({"N": mode, "SIZE": 1}))
    reply = connection.getresponse()
    body = reply.read().decode()
    connection.close()
    assert expected in body, (reply.status, body)
    assert "Traceback" not in server.log()[logged:]


@pytest.mark.parametrize("model", ["generator", "generator_process"])
def test_a_client_that_reads_nothing_does_not_hold_a_generator_models_instance(
        server: RunningServer, channel: grpc.Channel, model: str) -> None:
    """Once its client is a window behind, a generator is parked off the engine thread (before:
    its sends waited there, so one client that read slowly, or nothing until the HTTP/2 send
    timeout of 60 s, held the model's only instance and no other client was served); read
    later, the parked stream goes on to its end."""
    release = threading.Event()
    hog_request = _flood_request("hog", 300, 100_000, model)
    hog_request.parameters["triton_enable_empty_final_response"].bool_param = True
    try:
        hog = _stream(channel, [hog_request], release)
        assert next(hog).infer_response.id == "hog"  # it runs; it is read no further
        with _channel(server) as other:
            answer = next(_stream(other, [_flood_request("other", 1, 1, model)],
                                  release, timeout_s=10.0))  # well before the send timeout
            assert answer.infer_response.id == "other" and not answer.error_message
        rest = []
        for answer in hog:
            assert not answer.error_message and answer.infer_response.id == "hog"
            rest.append(answer)
            if answer.infer_response.parameters["triton_final_response"].bool_param:
                break
        assert len(rest) == 300  # 299 more responses, then the final flag alone
        assert not rest[-1].infer_response.raw_output_contents
    finally:
        release.set()


@pytest.mark.parametrize("model", ["generator", "generator_process"])
def test_a_parked_generator_is_closed_when_its_client_goes(
        server: RunningServer, repository: Path, model: str) -> None:
    """A client that read one response of a million, then went: its parked generator is
    closed when the call ends (not left parked for ever), and the model serves on. The call
    ends at its deadline here: a stalled stream's cancel or closed connection reaches the
    server only then, or at the send timeout (the transport's open bug)."""
    release = threading.Event()
    with _channel(server) as hog_channel:
        hog = _stream(hog_channel, [_flood_request("gone", 1_000_000, 100_003, model)], release,
                      timeout_s=3.0)
        assert next(hog).infer_response.id == "gone"
        marker = repository / model / "1" / "closed-100003"
        assert not marker.exists()
        release.set()  # (the channel's close waits for the thread sending its requests)
    _wait_for(marker)
    with _channel(server) as other:
        release = threading.Event()
        answer = next(_stream(other, [_flood_request("after", 1, 1, model)], release))
        release.set()
    assert answer.infer_response.id == "after" and not answer.error_message


def test_an_unload_is_not_held_by_a_stream_whose_client_reads_nothing(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    """A live decoupled stream holds its model version; an unload waited for it without bound
    (its client reads nothing, so the model never gets to its final response). The version
    now gets --exit-timeout-s, then is released and the stream fails."""
    write_pbtxt(tmp_path, "flood", FLOOD, FLOOD_PBTXT)
    server = server_factory(tmp_path, "--allow-python-models", "--model-control", "explicit",
                            "--load-model", "flood", "--exit-timeout-s", "1")
    release = threading.Event()
    with _channel(server) as channel:
        responses = _stream(channel, [_flood_request("held", 1_000_000, 1000)], release)
        try:
            assert not next(responses).error_message  # the stream is live, then read no more
            connection = http.client.HTTPConnection(server.url, timeout=20)
            connection.request("POST", "/v2/repository/models/flood/unload")
            reply = connection.getresponse()
            assert reply.status == 200, reply.read()
            reply.read()
            connection.request("GET", "/v2/models/flood/ready")
            assert connection.getresponse().status != 200
        finally:
            release.set()
