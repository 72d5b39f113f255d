"""A node behind HAProxy: every answer names its node (serval-node), on both transports and on
errors and refusals too; the agent check (up / weight / not ready / drain); on SIGTERM the drain
delay (not ready, still serving) before the listeners close.
"""

from __future__ import annotations

import asyncio
import http.client
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import orjson
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from serval.config import ServerConfig
from serval.server.build import NODE_HEADER, Server, start_server, stop_server
from tests import fixture_models
from tests.conftest import RunningServer, free_port
from tests.integration.http_helpers import Reply, call, infer
from tests.integration.test_build import LoopThread

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}
NODE = "node-a.rack-1"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("node")
    fixture_models.linear(root)
    return root


@pytest.fixture(scope="module")
def node(server_factory: Factory, repository: Path) -> tuple[RunningServer, int]:
    server = server_factory(repository, "--node-name", NODE, "--max-url-bytes", "256",
                            agent=True)
    assert server.agent_port is not None
    return server, server.agent_port


@pytest.fixture(scope="module")
def anonymous(server_factory: Factory, repository: Path) -> RunningServer:
    return server_factory(repository, "--no-node-header")


def ask_agent(port: int, send: bytes | None = b"weight\n") -> bytes:
    """One agent check as HAProxy makes it: connect, send `agent-send`, read to the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        if send is not None:
            sock.sendall(send)
        chunks = []
        while chunk := sock.recv(1024):
            chunks.append(chunk)
        return b"".join(chunks)


def _stub(server: RunningServer) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(server.grpc_url))


def _grpc_metadata(call_: Callable[[], object]) -> dict[str, str]:
    """Initial and trailing metadata of one call, whether it succeeds or fails (a failure
    before any reply is trailers-only: its headers come as trailing metadata)."""
    try:
        _, rpc = call_()  # type: ignore[misc]
    except grpc.RpcError as exc:
        rpc = exc
    return dict([*rpc.initial_metadata(), *rpc.trailing_metadata()])  # type: ignore[attr-defined]


def _infer_request(model: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    tensor.contents.fp32_contents.extend([0.5] * 8)
    return request


def test_every_http_answer_names_the_node(node: tuple[RunningServer, int]) -> None:
    server, _ = node
    answers: dict[str, Reply] = {
        "ready": call(server.url, "GET", "/v2/health/ready"),
        "infer": infer(server.url, "linear", X),
        "unknown model": infer(server.url, "nosuch", X),
        "no route": call(server.url, "GET", "/v3/nothing"),
        "wrong method": call(server.url, "DELETE", "/v2/health/live"),
        "refused": call(server.url, "GET", "/v2/models/" + "m" * 300),  # past --max-url-bytes
    }
    statuses = {what: reply.status for what, reply in answers.items()}
    assert statuses == {"ready": 200, "infer": 200, "unknown model": 404, "no route": 404,
                        "wrong method": 405, "refused": 414}
    for what, reply in answers.items():
        assert reply.headers.get(NODE_HEADER) == NODE, what


def test_every_grpc_answer_names_the_node(node: tuple[RunningServer, int]) -> None:
    server, _ = node
    stub = _stub(server)
    calls = {
        "live": lambda: stub.ServerLive.with_call(service_pb2.ServerLiveRequest(), timeout=10),
        "infer": lambda: stub.ModelInfer.with_call(_infer_request("linear"), timeout=10),
        "unknown model": lambda: stub.ModelInfer.with_call(_infer_request("nosuch"),
                                                           timeout=10),
    }
    for what, call_ in calls.items():
        assert _grpc_metadata(call_).get(NODE_HEADER) == NODE, what
    with pytest.raises(grpc.RpcError) as failed:
        stub.ModelInfer(_infer_request("nosuch"), timeout=10)
    assert failed.value.code() is grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]


def test_no_node_header_turns_it_off(anonymous: RunningServer) -> None:
    for reply in (infer(anonymous.url, "linear", X), infer(anonymous.url, "nosuch", X)):
        assert NODE_HEADER not in reply.headers
    stub = _stub(anonymous)
    for call_ in (lambda: stub.ModelInfer.with_call(_infer_request("linear"), timeout=10),
                  lambda: stub.ModelInfer.with_call(_infer_request("nosuch"), timeout=10)):
        assert NODE_HEADER not in _grpc_metadata(call_)


def test_the_agent_says_up_and_a_weight_when_asked(node: tuple[RunningServer, int]) -> None:
    _, agent_port = node
    assert ask_agent(agent_port) == b"up ready 100%\n"
    assert ask_agent(agent_port, None) == b"up ready\n"  # no agent-send: state only
    assert ask_agent(agent_port, b"status\n") == b"up ready\n"


@pytest.fixture
def loop() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


def test_in_process_the_agent_follows_readiness_and_draining(repository: Path,
                                                             loop: LoopThread) -> None:
    config = ServerConfig(repository=repository, http_port=0, grpc_port=0,
                          agent_port=free_port(), node_name="n1", drain_delay_s=60.0)
    server: Server = loop.run(start_server(config))
    agent_port, url = config.agent_port, f"127.0.0.1:{server.http_port}"
    stopping = None
    try:
        assert ask_agent(agent_port) == b"up ready 100%\n"
        server.stack.dataplane.set_ready(False)  # e.g. the models are not all loaded
        assert ask_agent(agent_port) == b"down#not ready\n"
        server.stack.dataplane.set_ready(True)
        stopping = asyncio.run_coroutine_threadsafe(stop_server(server, 5.0), loop.loop)
        _wait_for(lambda: ask_agent(agent_port) == b"drain\n", "the agent never said drain")
        assert call(url, "GET", "/v2/health/ready").status == 503
        reply = infer(url, "linear", X)  # the drain delay: still serving
        assert reply.status == 200 and reply.headers[NODE_HEADER] == "n1"
        assert ask_agent(agent_port) == b"drain\n"
    finally:
        loop.loop.call_soon_threadsafe(server.hurry.set)  # end the drain delay now
        if stopping is None:
            loop.run(stop_server(server, 5.0))
        else:
            stopping.result(60)
    with pytest.raises(OSError):  # listeners closed: the agent with the HTTP one
        ask_agent(agent_port)


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_sigterm_turns_not_ready_and_serves_on_for_the_drain_delay(
        server_factory: Factory, repository: Path) -> None:
    server = server_factory(repository, "--node-name", "n2", "--drain-delay-s", "2m",
                            agent=True)
    agent_port = server.agent_port
    assert agent_port is not None
    host, port = server.url.split(":")
    kept = http.client.HTTPConnection(host, int(port), timeout=30)  # open before SIGTERM
    try:
        kept.request("GET", "/v2/health/ready")
        ready = kept.getresponse()
        ready.read()
        assert ready.status == 200
        server.process.send_signal(signal.SIGTERM)
        _wait_for(lambda: call(server.url, "GET", "/v2/health/ready").status == 503,
                  "ready never turned 503")
        assert ask_agent(agent_port) == b"drain\n"
        kept.request("POST", "/v2/models/linear/infer", orjson.dumps(X))
        answer = kept.getresponse()
        assert answer.status == 200 and answer.getheader(NODE_HEADER) == "n2"
        assert orjson.loads(answer.read())["outputs"]
        assert infer(server.url, "linear", X).status == 200  # new connections too
        assert server.process.poll() is None  # two minutes of delay: still running
        server.process.send_signal(signal.SIGINT)  # Ctrl-C again: no more delay
        assert server.process.wait(timeout=30) == 0
    finally:
        kept.close()
