"""The proxy's own errors reach clients in KServe's form (`{"error": ...}`), with what went
wrong and what to do, not as HAProxy's HTML pages: a real HAProxy in front of a node that is
not there, and of one that never answers."""

from __future__ import annotations

import contextlib
import http.client
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from serval.cluster.haproxy import Node, ProxySettings, render
from serval.cluster.proxy import HaproxyProcess
from serval.ports import free_ports

httpclient = pytest.importorskip("tritonclient.http")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("haproxy") is None,
                                 reason="HAProxy is not installed (make setup installs it)")]


@contextlib.contextmanager
def _proxy(tmp_path: Path, port: int, node_port: int, **settings: int) -> Iterator[int]:
    """HAProxy on `port` in front of one node at node_port; yields the proxy's port."""
    config = tmp_path / "haproxy.cfg"
    config.write_text(render(ProxySettings(http_port=port, grpc_port=None, retries=1,
                                           **settings),
                             [Node("node", "127.0.0.1", node_port)]))
    process = HaproxyProcess(config, tmp_path / "haproxy.log")
    process.start()
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "haproxy.log").read_text()
                time.sleep(0.05)
        yield port
    finally:
        process.stop(grace_s=5)


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[int]:
    """In front of a node whose port nothing listens on."""
    port, absent = free_ports(2)
    with _proxy(tmp_path, port, absent) as ready:
        yield ready


def _get(port: int, path: str, headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path, headers=headers or {})
        reply = connection.getresponse()
        return reply.status, {k.lower(): v for k, v in reply.getheaders()}, reply.read()
    finally:
        connection.close()


def test_no_node_to_serve_is_a_503_in_kserve_form_with_retry_after(proxy: int) -> None:
    status, headers, body = _get(proxy, "/v2/models/m/ready")
    assert status == 503
    assert headers["content-type"] == "application/json"
    assert headers["retry-after"] == "1"
    assert "no node can take this request now" in orjson.loads(body)["error"]


def test_tritonclient_reads_the_proxys_error(proxy: int) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{proxy}")
    with pytest.raises(httpclient.InferenceServerException) as raised:
        client.get_model_metadata("m")
    assert "no node can take this request now" in str(raised.value)


def test_a_node_that_never_answers_is_a_504_naming_the_timeout(tmp_path: Path) -> None:
    with socket.socket() as silent:  # connections complete in its backlog; nothing answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        (free,) = free_ports(1)  # the silent node's port is held: it cannot be drawn
        with _proxy(tmp_path, free, silent.getsockname()[1], timeout_server_s=1) as port:
            status, headers, body = _get(port, "/v2/models/m/ready")
    assert status == 504
    assert headers["content-type"] == "application/json"
    assert "did not answer within 1 s" in orjson.loads(body)["error"]
