"""Attacks on what the server reports about itself (statistics, metrics, traces, logs, the
status page) on a real server with 10,000 models: none may hold the event loop, grow without
bound, or answer a bad value with a 5xx."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call, infer, metric, occupy

pytestmark = pytest.mark.integration
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}
MODELS = 10_000


@pytest.fixture(scope="module")
def many(server_factory: Callable[..., RunningServer],
         tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    """10,000 lazy models (one hard-linked file), two of them loaded."""
    root = tmp_path_factory.mktemp("many")
    source = fixture_models.linear(root / "build")
    repository = fixture_models.linked_repository(
        root / "repo", source, (f"tenant-{index:05d}" for index in range(MODELS)))
    server = server_factory(repository, "--model-control", "lazy", "--memory-budget", "8MiB",
                            "--trace-file", str(root / "trace.json"))
    for name in ("tenant-00042", "tenant-09999"):
        assert infer(server.url, name, X).status == 200
    return server


def test_grpc_statistics_of_every_model_built_a_slice_at_a_time(many: RunningServer) -> None:
    """ModelStatistics with no name over 10,000 models, built a slice of models at a time as
    messages (json_format.ParseDict held the loop 1.2-1.8 s a call): the same answer."""
    client = triton_grpc.InferenceServerClient(many.grpc_url)
    stats = client.get_inference_statistics().model_stats
    assert len(stats) == MODELS
    loaded = {s.name: s for s in stats if s.inference_count}
    assert set(loaded) == {"tenant-00042", "tenant-09999"}
    assert loaded["tenant-00042"].inference_stats.success.count == 1
    assert loaded["tenant-00042"].batch_stats[0].batch_size == 1


def test_http_statistics_of_every_model_built_a_slice_at_a_time(many: RunningServer) -> None:
    """/v2/models/stats over 10,000 models, streamed a slice at a time (built whole it held
    the loop 0.25 s a call): the same document."""
    reply = call(many.url, "GET", "/v2/models/stats")
    assert reply.status == 200
    doc = orjson.loads(reply.body)
    assert len(doc["model_stats"]) == MODELS
    one = {s["name"]: s for s in doc["model_stats"]}["tenant-09999"]
    assert one["inference_count"] == 1 and one["inference_stats"]["success"]["count"] == 1


def _resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_statistics_asked_on_many_connections_and_never_read_hold_little(
        many: RunningServer) -> None:
    """/v2/models/stats over 10,000 models is 4 MB from an 80-byte request. Asked on 24
    connections that read nothing, the server held every answer whole (and built several
    copies): +830 MiB measured. It is now sent as it is made, at the client's pace: a connection
    that does not read holds its write buffer (1 MiB); +6 MiB measured."""
    connections = 24
    before = _resident_bytes(many.process.pid)
    request = b"GET /v2/models/stats HTTP/1.1\r\nHost: x\r\n\r\n"
    sockets = []
    try:
        for _ in range(connections):
            sock = socket.create_connection(("127.0.0.1", many.port), timeout=30)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(request * 8)  # pipelined, and never read
            sockets.append(sock)
        for sock in sockets:  # each answer has begun: the server has served this connection
            begun = b""
            while len(begun) < 12 and (piece := sock.recv(12 - len(begun))):
                begun += piece
            assert begun == b"HTTP/1.1 200"
        grown = _resident_bytes(many.process.pid) - before
        assert call(many.url, "GET", "/v2/health/live").status == 200
        assert grown < 150 * 2**20, f"the server grew {grown / 2**20:.0f} MiB"
    finally:
        for sock in sockets:
            sock.close()
    whole = call(many.url, "GET", "/v2/models/stats")  # chunked: http.client joins it
    assert whole.headers.get("transfer-encoding") == "chunked"
    assert len(orjson.loads(whole.body)["model_stats"]) == MODELS
    head = call(many.url, "HEAD", "/v2/models/stats")
    assert head.status == 200 and head.body == b""
    client = triton_http.InferenceServerClient(many.url)
    assert len(client.get_inference_statistics()["model_stats"]) == MODELS


def test_one_models_statistics_are_unchanged(many: RunningServer) -> None:
    reply = call(many.url, "GET", "/v2/models/tenant-00042/versions/1/stats")
    assert reply.status == 200
    (entry,) = reply.json()["model_stats"]
    assert entry["name"] == "tenant-00042" and entry["inference_count"] == 1
    client = triton_grpc.InferenceServerClient(many.grpc_url)
    (message,) = client.get_inference_statistics("tenant-00042", "1").model_stats
    assert message.inference_count == 1 and message.version == "1"
    with pytest.raises(triton_grpc.InferenceServerException, match="not available"):
        client.get_inference_statistics("no-such-model")
    assert call(many.url, "GET", "/v2/models/no-such-model/stats").status == 404


def _ask_agent(port: int, send: bytes = b"weight\n") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(send)
        answer = b""
        while chunk := sock.recv(256):
            answer += chunk
    return answer


def test_the_agent_weight_falls_when_the_receive_budget_is_held(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    """A client holding the receive budget (bodies sent slowly) makes the node answer every
    new request 429, yet the agent told the proxy `up ready 100%`. Now the weight counts the
    budget too: 25%, the floor (0 would drain)."""
    fixture_models.linear(tmp_path / "repo")
    server = server_factory(tmp_path / "repo", "--receive-budget-mb", "1", agent=True)
    assert server.agent_port is not None
    assert _ask_agent(server.agent_port) == b"up ready 100%\n"
    held = (1 << 20) - 8  # of the 1 MiB budget: no request fits beside it
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
        slow.sendall(b"POST /v2/models/linear/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (held + 8)
                     + b" " * held)
        deadline = time.monotonic() + 10
        while metric(server.url, "serval_receive_budget_held_bytes") < held:
            assert time.monotonic() < deadline, "the body's bytes were never held"
            time.sleep(0.01)
        refused = infer(server.url, "linear", X)
        assert refused.status == 429  # what the proxy would send this node now
        assert _ask_agent(server.agent_port) == b"up ready 25%\n"
    deadline = time.monotonic() + 10
    while metric(server.url, "serval_receive_budget_held_bytes") > 0:
        assert time.monotonic() < deadline, "the budget was never released"
        time.sleep(0.01)
    assert _ask_agent(server.agent_port) == b"up ready 100%\n"


def test_the_status_page_counts_requests_refused_for_overload(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    """Requests refused at admission (429: the queue ahead would miss their deadline) were
    counted by /metrics (outcome="overloaded") but not by the status page, whose requests and
    errors came from the latency histogram: a flood of 429s read as no errors at all. They
    count as requests and errors now (and stay out of the latency percentiles)."""
    fixture_models.slow(tmp_path)
    (tmp_path / "slow" / "config.yaml").write_text("max_batch_size: 128\n")
    server = server_factory(tmp_path)
    big = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [128, 1024],
                                    "data": [0.01] * (128 * 1024)}]})
    one_row = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1024],
                                        "data": [0.1] * 1024}]})
    for _ in range(2):  # the model's batch times, measured
        assert call(server.url, "POST", "/v2/models/slow/infer", big).status == 200
    refused = 0
    blocker = occupy(server.url, "slow", big)
    for _ in range(5):
        reply = call(server.url, "POST", "/v2/models/slow/infer", one_row,
                     {"Serval-Timeout-Ms": "5"})
        refused += reply.status == 429
    blocker.join(timeout=60)
    assert refused == 5
    assert metric(server.url, 'serval_requests_total{model="slow",outcome="overloaded",'
                  'version="1"}') == 5
    summary = call(server.url, "GET", "/status").json()
    assert (summary["requests_total"], summary["errors_total"]) == (8, 5)
    row = call(server.url, "GET", "/status/models").json()["models"][0]
    assert row["name"] == "slow" and row["requests_total"] == 8
    detail = call(server.url, "GET", "/status/models/slow").json()
    assert detail["versions"][0]["requests_total"] == 8
