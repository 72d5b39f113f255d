"""Decoupled models on a real server: 0, 1 and n responses per request over ModelStreamInfer,
final flags and empty final responses, interleaving with other requests (a model that is not
decoupled on the same stream unaffected), errors mid-stream, unary calls refused on both
transports, and cancellation reaching the model in its worker process when the client cancels,
closes its connection or its deadline passes; Serval's own generator models too."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests import triton_decoupled_models as models
from tests import triton_python_models
from tests.conftest import RunningServer

pytestmark = pytest.mark.integration

WAIT_S = 30.0


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = models.build_all(tmp_path_factory.mktemp("decoupled"))
    triton_python_models.add_sub(root, "add_sub")
    return root


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer], repository: Path) -> RunningServer:
    return server_factory(repository, "--allow-python-models")


@dataclass
class Seen:
    """One message of the stream as the client's callback got it."""

    id: str
    out: list[int] | None
    final: bool
    error: str | None = None


class Stream:
    """tritonclient's stream, its callback's messages in a queue."""

    def __init__(self, server: RunningServer, **options: Any) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.messages: queue.Queue[Seen] = queue.Queue()
        self.client.start_stream(callback=self._callback, **options)

    def _callback(self, result: Any, error: Any) -> None:
        if error is not None:
            self.messages.put(Seen("", None, True, str(error)))
            return
        response = result.get_response()
        out = result.as_numpy("OUT")
        self.messages.put(Seen(response.id, None if out is None else out.ravel().tolist(),
                               response.parameters["triton_final_response"].bool_param))

    def modes(self, request_id: str, mode: str, n: int = 0, empty_final: bool = False) -> None:
        self.send("modes", request_id, {"MODE": [models.MODES[mode]], "N": [n]}, empty_final)

    def send(self, model: str, request_id: str, values: dict[str, list[int]],
             empty_final: bool = False, dtype: Any = np.int32) -> None:
        inputs = []
        for name, data in values.items():
            array = np.array(data, dtype=dtype)
            inputs.append(grpcclient.InferInput(name, list(array.shape), "INT32"))
            inputs[-1].set_data_from_numpy(array)
        self.client.async_stream_infer(model, inputs, request_id=request_id,
                                       enable_empty_final_response=empty_final)

    def take(self, count: int) -> list[Seen]:
        return [self.messages.get(timeout=WAIT_S) for _ in range(count)]

    def until(self, done: Callable[[list[Seen]], bool]) -> list[Seen]:
        seen: list[Seen] = []
        while not done(seen):
            seen.append(self.messages.get(timeout=WAIT_S))
        return seen

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


@pytest.fixture
def stream(server: RunningServer) -> Iterator[Stream]:
    opened = Stream(server)
    yield opened
    opened.close(cancel=True)


def _wait_for_file(path: Path) -> str:
    """The text the model wrote to `path`. The model writes with `write_text`, so the file can
    exist before its text does: wait for the text, not just the name."""
    deadline = time.monotonic() + WAIT_S
    while not (text := path.read_text() if path.exists() else ""):
        assert time.monotonic() < deadline, f"{path.name} never appeared (or stayed empty)"
        time.sleep(0.05)
    return text


@pytest.mark.parametrize(("mode", "n", "empty_final", "expected"), [
    ("bare_final", 0, True, [(None, True)]),
    ("bare_final", 1, False, [([0], False)]),
    ("bare_final", 3, False, [([0], False), ([1], False), ([2], False)]),
    ("bare_final", 3, True, [([0], False), ([1], False), ([2], False), (None, True)]),
    ("final_with_last", 1, False, [([0], True)]),
    ("final_with_last", 3, True, [([0], False), ([1], False), ([2], True)]),
])
def test_zero_one_and_n_responses_with_their_final_flags(
        stream: Stream, mode: str, n: int, empty_final: bool,
        expected: list[tuple[list[int] | None, bool]]) -> None:
    stream.modes("r", mode, n, empty_final)
    stream.modes("end", "final_with_last", 1)  # run after it: r's responses are all sent

    def both(got: list[Seen]) -> bool:  # (responses of the two may interleave on the way)
        return (any(s.id == "end" for s in got)
                and len([s for s in got if s.id == "r"]) >= len(expected))

    seen = stream.until(both)
    assert [(s.out, s.final) for s in seen if s.id == "r"] == expected


def test_no_response_and_no_empty_final_sends_nothing(stream: Stream) -> None:
    stream.modes("quiet", "bare_final", 0)
    stream.modes("end", "final_with_last", 1)
    seen = stream.until(lambda got: any(s.id == "end" for s in got))
    assert [s.id for s in seen] == ["end"]


def test_responses_interleave_and_an_ordinary_model_on_the_stream_is_unaffected(
        stream: Stream, repository: Path) -> None:
    stream.modes("endless", "until_cancelled")
    first = stream.take(1)  # it answers before the others come, and after
    stream.send("square_int32", "square", {"IN": [2]})
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    stream.send("add_sub", "plain", {"INPUT0": a.tolist(), "INPUT1": a.tolist()})

    def endless_after_the_others(seen: list[Seen]) -> bool:
        square = [i for i, s in enumerate(seen) if s.id == "square"]
        plain = [i for i, s in enumerate(seen) if s.id == "plain"]
        return (len(square) == 2 and bool(plain)
                and any(s.id == "endless" for s in seen[max(*square, *plain):]))

    seen = first + stream.until(endless_after_the_others)
    assert seen[0].id == "endless"
    assert [(s.out, s.final) for s in seen if s.id == "square"] == [([2], False)] * 2
    plain = [s for s in seen if s.id == "plain"]
    assert len(plain) == 1 and plain[0].final and plain[0].error is None
    endless = [s.out for s in seen if s.id == "endless"]
    assert endless == [[i] for i in range(len(endless))]
    stream.close(cancel=True)
    marker = json.loads(_wait_for_file(repository / "modes" / "cancelled-endless"))
    assert marker["request"] is True and marker["sent"] >= len(endless)


def test_an_error_response_midway_does_not_end_the_request(stream: Stream) -> None:
    stream.modes("err", "error_midway")
    seen = stream.take(3)
    assert (seen[0].out, seen[0].final) == ([0], False)
    assert seen[1].error is not None and "mode 2 fails its second response" in seen[1].error
    assert (seen[2].out, seen[2].final) == ([1], True)


def test_execute_raising_fails_its_request_and_the_stream_goes_on(stream: Stream) -> None:
    stream.modes("boom", "raise")
    [failed] = stream.take(1)
    assert failed.error is not None and "Traceback" not in failed.error
    assert "/" not in failed.error.split("request id")[0]  # no path
    stream.modes("after", "final_with_last", 2)
    assert [(s.id, s.out, s.final) for s in stream.take(2)] == [
        ("after", [0], False), ("after", [1], True)]


def test_a_bad_request_is_refused_precisely_and_the_stream_goes_on(stream: Stream) -> None:
    stream.send("modes", "bad", {"MODE": [0, 0], "N": [1]})
    [refused] = stream.take(1)
    assert refused.error is not None
    assert "input 'MODE': shape [2] given, model expects [1]" in refused.error
    stream.modes("after", "final_with_last", 1)
    assert [(s.id, s.final) for s in stream.take(1)] == [("after", True)]


def test_outputs_in_shared_memory_are_refused_for_a_decoupled_model(
        server: RunningServer, stream: Stream) -> None:
    import os

    import tritonclient.utils.shared_memory as shm

    key = f"/decoupled_out_{os.getpid()}"
    handle = shm.create_shared_memory_region("dout", key, 64)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.register_system_shared_memory("dout", key, 64)
        inputs = []
        for name, value in (("MODE", models.MODES["final_with_last"]), ("N", 1)):
            inputs.append(grpcclient.InferInput(name, [1], "INT32"))
            inputs[-1].set_data_from_numpy(np.array([value], np.int32))
        output = grpcclient.InferRequestedOutput("OUT")
        output.set_shared_memory("dout", 64)
        stream.client.async_stream_infer("modes", inputs, request_id="shm", outputs=[output])
        [refused] = stream.take(1)
        assert refused.error is not None
        assert "output 'OUT' of decoupled model 'modes' is asked for in shared memory" in (
            refused.error)
        stream.modes("after", "final_with_last", 1)
        assert [(s.id, s.final) for s in stream.take(1)] == [("after", True)]
    finally:
        client.unregister_system_shared_memory("dout")
        shm.destroy_shared_memory_region(handle)


def test_sending_after_the_final_flag_raises_in_the_model(stream: Stream,
                                                           repository: Path) -> None:
    stream.modes("twice", "send_after_final")
    assert [(s.out, s.final) for s in stream.take(1)] == [([0], True)]
    text = _wait_for_file(repository / "modes" / "send_after_final")
    assert text == "Unable to send response. Response sender has been closed."


def _modes_inputs(module: Any) -> list[Any]:
    inputs = []
    for name in ("MODE", "N"):
        inputs.append(module.InferInput(name, [1], "INT32"))
        inputs[-1].set_data_from_numpy(np.array([1], dtype=np.int32))
    return inputs


def test_unary_grpc_is_refused_as_triton_refuses_it(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("modes", _modes_inputs(grpcclient))
    assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "doesn't support models with decoupled transaction policy" in str(refused.value)
    assert "ModelStreamInfer" in str(refused.value)


def test_rest_is_refused_with_a_400_naming_the_stream(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("modes", _modes_inputs(httpclient))
    assert refused.value.status() == "400"
    assert "model 'modes' is decoupled" in str(refused.value)
    assert client.get_model_config("modes")["model_transaction_policy"] == {"decoupled": True}


def test_cancelling_the_stream_stops_the_model(server: RunningServer,
                                               repository: Path) -> None:
    stream = Stream(server)
    stream.modes("cancelled", "until_cancelled")
    stream.take(3)  # it runs
    stream.close(cancel=True)
    marker = json.loads(_wait_for_file(repository / "modes" / "cancelled-cancelled"))
    assert marker["request"] is True


def test_a_closed_connection_stops_the_model(server: RunningServer, repository: Path) -> None:
    channel = grpc.insecure_channel(server.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = service_pb2.ModelInferRequest(model_name="modes", id="closed")
    for name, value in (("MODE", models.MODES["until_cancelled"]), ("N", 0)):
        request.inputs.add(name=name, datatype="INT32", shape=[1])
        request.raw_input_contents.append(np.array([value], dtype=np.int32).tobytes())
    release = threading.Event()

    def requests() -> Iterator[service_pb2.ModelInferRequest]:
        yield request
        release.wait(WAIT_S)  # the stream stays open until the connection goes

    responses = stub.ModelStreamInfer(requests())
    assert next(responses).infer_response.id == "closed"
    channel.close()
    release.set()
    marker = json.loads(_wait_for_file(repository / "modes" / "cancelled-closed"))
    assert marker["request"] is True


def test_the_streams_deadline_stops_the_model(server: RunningServer, repository: Path) -> None:
    stream = Stream(server, stream_timeout=1.0)
    stream.modes("deadline", "until_cancelled")
    seen = stream.until(lambda got: bool(got) and got[-1].error is not None)
    assert "Deadline" in (seen[-1].error or "") or "deadline" in (seen[-1].error or "")
    marker = json.loads(_wait_for_file(repository / "modes" / "cancelled-deadline"))
    assert marker["request"] is True
    stream.close(cancel=True)


def test_servals_own_generator_model_streams_and_refuses_unary_calls(
        stream: Stream, server: RunningServer) -> None:
    stream.send("counter", "count", {"N": [3]}, empty_final=True)
    assert [(s.out, s.final) for s in stream.take(4)] == [
        ([0], False), ([1], False), ([2], False), (None, True)]
    stream.send("counter", "fails", {"N": [-3]})
    first, failed = stream.take(2)
    assert (first.id, first.out) == ("fails", [0]) and failed.error is not None
    client = httpclient.InferenceServerClient(server.url)
    infer_input = httpclient.InferInput("N", [1], "INT32")
    infer_input.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="model 'counter' is decoupled"):
        client.infer("counter", [infer_input])
