"""The proxy's own errors reach clients in KServe's form (`{"error": ...}`), with what went
wrong and what to do, not as HAProxy's HTML pages: a real HAProxy in front of a node that is
not there, and of one that never answers."""

from __future__ import annotations

import contextlib
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from serval.cluster.haproxy import Node, ProxySettings, render
from serval.cluster.proxy import HaproxyProcess, RuntimeApi
from serval.ports import free_ports
from tests.integration.http_helpers import call

httpclient = pytest.importorskip("tritonclient.http")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("haproxy") is None,
                                 reason="HAProxy is not installed (make setup installs it)")]


@contextlib.contextmanager
def _proxy(tmp_path: Path, port: int, node_port: int, **settings: int) -> Iterator[str]:
    """HAProxy on `port` in front of one node at node_port; yields the proxy's host:port."""
    config, sock = tmp_path / "haproxy.cfg", tmp_path / "haproxy.sock"
    config.write_text(render(ProxySettings(http_port=port, grpc_port=None, retries=1,
                                           stats_socket=str(sock), **settings),
                             [Node("node", "127.0.0.1", node_port)]))
    process = HaproxyProcess(config, tmp_path / "haproxy.log")
    process.start()
    try:
        assert RuntimeApi(sock).wait_ready(15), (tmp_path / "haproxy.log").read_text()
        yield f"127.0.0.1:{port}"
    finally:
        process.stop(grace_s=5)


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[str]:
    """In front of a node whose port nothing listens on."""
    port, absent = free_ports(2)
    with _proxy(tmp_path, port, absent) as url:
        yield url


def test_no_node_to_serve_is_a_503_in_kserve_form_with_retry_after(proxy: str) -> None:
    reply = call(proxy, "GET", "/v2/models/m/ready")
    assert reply.status == 503
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["retry-after"] == "1"
    assert "no node can take this request now" in reply.error


def test_tritonclient_reads_the_proxys_error(proxy: str) -> None:
    client = httpclient.InferenceServerClient(proxy)
    with pytest.raises(httpclient.InferenceServerException) as raised:
        client.get_model_metadata("m")
    assert "no node can take this request now" in str(raised.value)


def test_a_node_that_never_answers_is_a_504_naming_the_timeout(tmp_path: Path) -> None:
    with socket.socket() as silent:  # connections complete in its backlog; nothing answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        (free,) = free_ports(1)  # the silent node's port is held: it cannot be drawn
        with _proxy(tmp_path, free, silent.getsockname()[1], timeout_server_s=1) as url:
            reply = call(url, "GET", "/v2/models/m/ready")
    assert reply.status == 504
    assert reply.headers["content-type"] == "application/json"
    assert "did not answer within 1 s" in reply.error


def test_a_refused_configuration_names_haproxys_alert(tmp_path: Path) -> None:
    from serval.cluster.proxy import check_config
    from serval.errors import ConfigError

    config = tmp_path / "haproxy.cfg"
    config.write_text("global\n    nbthread 100000\n")
    with pytest.raises(ConfigError, match=r"refused the generated configuration: .*ALERT.*"
                                          r"nbthread"):
        check_config(config)
