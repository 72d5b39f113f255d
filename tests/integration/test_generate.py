"""Triton's generate extension on a real server: /generate answers one JSON object made of
the model's outputs; /generate_stream answers Server-Sent Events, one per response of a
decoupled model as it is sent (errors after the first as error events), over a connection that
stays usable; closing the connection mid-stream stops the model."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests import triton_decoupled_models as models
from tests.conftest import RunningServer
from tests.triton_python_models import write

pytestmark = pytest.mark.integration

UPPER = '''
import numpy as np


class Model:
    def load(self, ctx):
        pass

    def infer(self, inputs):
        text = inputs["text_input"][:, 0]
        tokens = inputs["max_tokens"][:, 0].astype(np.float32)
        return {"text_output": np.array([[t.upper()] for t in text], dtype=object),
                "scores": np.stack([tokens, [float(len(t)) for t in text]], axis=1)}
'''
UPPER_CONFIG = """\
backend: python
max_batch_size: 8
inputs:
  - {name: text_input, datatype: BYTES, dims: [1]}
  - {name: max_tokens, datatype: INT32, dims: [1]}
outputs:
  - {name: text_output, datatype: BYTES, dims: [1]}
  - {name: scores, datatype: FP32, dims: [2]}
"""
WORDS = '''
import numpy as np


class Model:
    def load(self, ctx):
        pass

    def infer(self, inputs):
        for word in inputs["text_input"][0].split():
            yield {"text_output": np.array([word], dtype=object)}
'''
WORDS_CONFIG = """\
backend: python
max_batch_size: 0
inputs:
  - {name: text_input, datatype: BYTES, dims: [1]}
outputs:
  - {name: text_output, datatype: BYTES, dims: [1]}
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = models.build_all(tmp_path_factory.mktemp("generate"))
    write(root, "upper", UPPER, UPPER_CONFIG)
    write(root, "words", WORDS, WORDS_CONFIG)
    return root


@pytest.fixture(scope="module")
def server(server_factory: Callable[..., RunningServer], repository: Path) -> RunningServer:
    return server_factory(repository, "--allow-python-models")


def _post(connection: http.client.HTTPConnection, path: str, doc: Any
          ) -> tuple[int, str, bytes]:
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    connection.request("POST", path, body=body, headers={"content-type": "application/json"})
    reply = connection.getresponse()
    return reply.status, reply.getheader("content-type") or "", reply.read()


def _events(body: bytes) -> list[dict[str, Any]]:
    chunks = body.decode().split("\n\n")
    assert chunks[-1] == ""  # every event ends with a blank line
    assert all(chunk.startswith("data: ") for chunk in chunks[:-1]), body
    return [json.loads(chunk.removeprefix("data: ")) for chunk in chunks[:-1]]


@pytest.fixture
def connection(server: RunningServer) -> http.client.HTTPConnection:
    host, port = server.url.split(":")
    return http.client.HTTPConnection(host, int(port), timeout=30)


def test_generate_answers_the_outputs_as_fields(connection: http.client.HTTPConnection) -> None:
    status, kind, body = _post(connection, "/v2/models/upper/generate",
                               {"text_input": "héllo", "max_tokens": 3,
                                "parameters": {"temperature": 0.5}, "stream": False})
    assert (status, kind) == (200, "application/json"), body
    assert orjson.loads(body) == {"model_name": "upper", "model_version": "1",
                                  "text_output": "HéLLO", "scores": [3.0, 6.0]}
    status, _, body = _post(connection, "/v2/models/upper/versions/1/generate",
                            {"text_input": ["abc"], "max_tokens": [1]})
    assert status == 200 and orjson.loads(body)["text_output"] == "ABC"


@pytest.mark.parametrize(("path", "doc", "status", "named"), [
    ("upper/generate", {"max_tokens": 3}, 400, "has no field 'text_input'"),
    ("upper/generate", {"text_input": "a", "max_tokens": "many"}, 400, "INT32 data must be"),
    ("upper/generate", {"text_input": {"a": 1}, "max_tokens": 1}, 400, "rectangular list"),
    ("upper/generate", {"text_input": "a", "max_tokens": 1, "top_k": [1]}, 400,
     "parameter 'top_k' must be a string, number or boolean"),
    ("upper/generate", {"text_input": ["a", "b"], "max_tokens": 1}, 400, "shape"),
    ("upper/generate", b"[1, 2]", 400, "must be a JSON object"),
    ("upper/generate", b"{", 400, "not valid JSON"),
    ("words/generate", {"text_input": "a b"}, 400, "decoupled"),
    ("nope/generate", {"text_input": "a"}, 404, "'nope' is not found"),
])
def test_bad_generate_requests_are_refused_with_a_reason(
        connection: http.client.HTTPConnection, path: str, doc: Any, status: int,
        named: str) -> None:
    got, kind, body = _post(connection, f"/v2/models/{path}", doc)
    assert (got, kind) == (status, "application/json"), body
    assert named in orjson.loads(body)["error"]


def test_generate_takes_post_only(connection: http.client.HTTPConnection) -> None:
    connection.request("GET", "/v2/models/upper/generate")
    reply = connection.getresponse()
    assert reply.status == 405 and b"use POST" in reply.read()


def test_generate_stream_sends_each_response_as_an_event(
        connection: http.client.HTTPConnection) -> None:
    status, kind, body = _post(connection, "/v2/models/words/generate_stream",
                               {"text_input": "the quick brown fox"})
    assert (status, kind) == (200, "text/event-stream; charset=utf-8")
    assert [event["text_output"] for event in _events(body)] == ["the", "quick", "brown", "fox"]
    # the same connection carries on: a model that is not decoupled answers one event
    status, _, body = _post(connection, "/v2/models/upper/generate_stream",
                            {"text_input": "x", "max_tokens": 2})
    assert status == 200 and _events(body) == [{"model_name": "upper", "model_version": "1",
                                                "text_output": "X", "scores": [2.0, 1.0]}]
    status, _, body = _post(connection, "/v2/models/words/generate_stream",
                            {"text_input": " "})  # no word: no response, only the final flag
    assert status == 200 and body == b""


def test_an_error_after_the_first_response_is_an_error_event(
        connection: http.client.HTTPConnection) -> None:
    status, _, body = _post(connection, "/v2/models/counter/generate_stream", {"N": -3})
    events = _events(body)
    assert status == 200 and events[0]["OUT"] == 0
    assert len(events) == 2 and "N < 0 fails after the first response" in events[1]["error"]
    # an error before any response is a plain JSON error with its status
    status, kind, body = _post(connection, "/v2/models/counter/generate_stream", {"N": "x"})
    assert (status, kind) == (400, "application/json") and b"INT32" in body


def test_closing_the_connection_mid_stream_stops_the_model(
        server: RunningServer, repository: Path) -> None:
    host, port = server.url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("POST", "/v2/models/modes/generate_stream", body=orjson.dumps(
        {"MODE": models.MODES["until_cancelled"], "N": 0, "id": "generate-closed"}))
    reply = connection.getresponse()
    assert reply.status == 200
    first = reply.fp.readline()  # the first chunk's size line: the model is sending
    assert first.strip()
    connection.close()
    _assert_cancelled(repository / "modes" / "cancelled-generate-closed")


def test_a_stream_past_its_deadline_ends_with_an_error_and_stops_the_model(
        connection: http.client.HTTPConnection, repository: Path) -> None:
    connection.request("POST", "/v2/models/modes/generate_stream", body=orjson.dumps(
        {"MODE": models.MODES["until_cancelled"], "N": 0, "id": "generate-deadline"}),
        headers={"Serval-Timeout-Ms": "500"})
    reply = connection.getresponse()
    events = _events(reply.read())  # the body ends: the server ended the stream
    assert reply.status == 200 and events[0]["OUT"] == 0
    assert "deadline (Serval-Timeout-Ms) passed" in events[-1]["error"]
    _assert_cancelled(repository / "modes" / "cancelled-generate-deadline")


def _assert_cancelled(marker: Path) -> None:
    """The model wrote `marker` on seeing its request cancelled (polled, with a deadline)."""
    deadline = time.monotonic() + 30
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "the model was not cancelled"
        time.sleep(0.05)
    assert json.loads(marker.read_text())["request"] is True


def test_a_client_that_stops_reading_a_stream_is_cut_off(
        server_factory: Callable[..., RunningServer], repository: Path) -> None:
    server = server_factory(repository, "--allow-python-models", "--body-timeout-s", "1",
                            "--write-buffer-kb", "64")
    host, port = server.url.split(":")
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect((host, int(port)))
    body = orjson.dumps({"text_input": "word " * 400_000})  # 2 MB in, 400,000 events (~24 MB)
    client.sendall(b"POST /v2/models/words/generate_stream HTTP/1.1\r\nhost: x\r\n"
                   b"content-length: %d\r\n\r\n%s" % (len(body), body))
    deadline = time.monotonic() + 60  # never read: the server's writes stall, then it cuts
    while "write stall" not in server.log():
        assert time.monotonic() < deadline, "the stalled stream was not cut off"
        time.sleep(0.1)
    received = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := client.recv(1 << 20):
            received += chunk
    client.close()
    assert received.startswith(b"HTTP/1.1 200") and not received.endswith(b"0\r\n\r\n")
    assert len(received) < len(body) * 2  # far from all of it was sent
    status, _, _ = _post(http.client.HTTPConnection(host, int(port), timeout=30),
                         "/v2/models/upper/generate", {"text_input": "ok", "max_tokens": 1})
    assert status == 200  # the server serves on
