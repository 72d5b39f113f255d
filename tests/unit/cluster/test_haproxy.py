"""The HAProxy configuration generator: what it routes on, and that HAProxy itself accepts it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from serval.cluster.haproxy import Discovery, Node, ProxySettings, render

pytestmark = pytest.mark.unit

NODES = [Node("a", "10.0.0.1", 8000, 8001, 8002, 1), Node("b", "10.0.0.2", 8000, 8001, None, 2),
         Node("c", "::1", 9000, None, 9002, 7)]


def _section(text: str, header: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(header)
    end = next((i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace()),
               len(lines))
    return [line.strip() for line in lines[start + 1:end] if line.strip()]


def test_rest_routes_on_the_models_path_segment_and_never_retries_control() -> None:
    http = _section(render(ProxySettings(), NODES), "frontend http")
    assert ("http-request set-var(txn.model) path,field(4,/),url_dec if "
            "{ path_beg /v2/models/ }") in http
    assert ("http-request set-var(txn.model) path,field(5,/),url_dec if "
            "{ path_beg /v2/repository/models/ }") in http
    assert "http-request disable-l7-retry if { path_beg /v2/repository/ }" in http
    assert http[-1] == "default_backend http_home"


def test_grpc_routes_on_field_one_or_the_model_header_and_streams_are_not_retried() -> None:
    grpc = _section(render(ProxySettings(), NODES), "frontend grpc")
    # the name is read from the message's first bytes (after the 5-byte gRPC prefix), so a
    # message larger than the proxy's buffer is routed too (ungrpc needs the whole message)
    assert any("req.body,bytes(5),protobuf(1) if" in line and "!compressed" in line
               for line in grpc)
    assert any("req.body,bytes(5),protobuf(2) if" in line and "control_call" in line
               for line in grpc)
    assert "http-request set-var(txn.model) req.hdr(serval-model) if model_header" in grpc
    assert "http-request disable-l7-retry if control_call || stream_call" in grpc


def test_both_backends_share_one_ring_and_only_spread_is_bounded() -> None:
    text = render(ProxySettings(balance_factor=150), NODES)
    home, spread = _section(text, "backend http_home"), _section(text, "backend http_spread")
    servers = [line.split(" id ")[0] + " id " + line.split(" id ")[1].split()[0]
               for line in home if line.startswith("server ")]
    assert servers == [line.split(" id ")[0] + " id " + line.split(" id ")[1].split()[0]
                       for line in spread if line.startswith("server ")]
    assert servers == ["server a 10.0.0.1:8000 id 1", "server b 10.0.0.2:8000 id 2",
                       "server c [::1]:9000 id 7"]
    assert "hash-balance-factor 150" in spread
    assert not any("hash-balance-factor" in line for line in home)
    # every backend probes each node, and 3 failed connections in a row take it out at once
    for section in (home, spread):
        assert any(line.startswith("default-server check") and
                   "observe layer4 error-limit 3 on-error mark-down" in line for line in section)
    assert not any("track " in line for line in text.splitlines())


def test_grpc_backends_skip_nodes_without_a_grpc_port_and_speak_h2() -> None:
    grpc_home = _section(render(ProxySettings(), NODES), "backend grpc_home")
    servers = [line for line in grpc_home if line.startswith("server ")]
    assert [line.split()[1] for line in servers] == ["a", "b"]
    assert any(line.startswith("default-server") and line.endswith("proto h2")
               for line in grpc_home)


def test_the_agent_is_asked_for_a_weight_only_where_load_is_bounded() -> None:
    text = render(ProxySettings(), NODES)
    assert 'agent-send "state\\n"' in "\n".join(_section(text, "backend http_home"))
    assert 'agent-send "weight\\n"' in "\n".join(_section(text, "backend http_spread"))
    home = _section(text, "backend http_home")
    assert any("agent-check agent-port 8002" in line for line in home if " a " in f" {line} ")
    assert not any("agent-check" in line for line in home if line.startswith("server b "))


def test_hot_models_are_counted_per_name_and_sent_to_spread() -> None:
    http = _section(render(ProxySettings(hot_rate=40), NODES), "frontend http")
    assert any("track-sc0 var(txn.model) table models" in line for line in http)
    assert any(line.startswith("use_backend http_spread") and "gt 40" in line for line in http)


def test_dns_discovery_uses_a_server_template() -> None:
    text = render(ProxySettings(), Discovery("serval.ns.svc.cluster.local", slots=8))
    assert "resolvers dns" in text
    home = _section(text, "backend http_home")
    assert any(line.startswith("server-template node 8 serval.ns.svc.cluster.local:8000")
               for line in home)


def test_no_grpc_frontend_without_a_grpc_port() -> None:
    text = render(ProxySettings(grpc_port=None), NODES)
    assert "frontend grpc" not in text and "backend grpc_home" not in text


@pytest.mark.parametrize(("spec", "expected"), [
    ("10.0.0.5:8000", Node("node3", "10.0.0.5", 8000, None, None, 3)),
    ("n1=10.0.0.5:8000:8001:8002", Node("n1", "10.0.0.5", 8000, 8001, 8002, 3)),
    ("n1=host.example:8000:-:8002", Node("n1", "host.example", 8000, None, 8002, 3)),
    ("[fd00::1]:8000:8001", Node("node3", "fd00::1", 8000, 8001, None, 3)),
])
def test_node_specs_parse(spec: str, expected: Node) -> None:
    assert Node.parse(spec, 3) == expected


@pytest.mark.parametrize(("spec", "message"), [
    ("10.0.0.5", r"expected \[NAME=\]HOST:HTTP"),
    ("10.0.0.5:http", r"expected \[NAME=\]HOST:HTTP"),
    ("10.0.0.5:8000:x", "ports are numbers"),
    ("bad name=10.0.0.5:8000", "node name"),
    ("n=10.0.0.5:70000", "outside 1-65535"),
])
def test_bad_node_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Node.parse(spec, 1)


def test_duplicate_names_or_ids_and_a_low_balance_factor_are_refused() -> None:
    with pytest.raises(ValueError, match="names must be unique"):
        render(ProxySettings(), [NODES[0], Node("a", "10.0.0.9", 8000, id=9)])
    with pytest.raises(ValueError, match="ids must be unique"):
        render(ProxySettings(), [NODES[0], Node("z", "10.0.0.9", 8000, id=1)])
    with pytest.raises(ValueError, match="balance factor"):
        ProxySettings(balance_factor=100)


def test_the_proxys_own_errors_are_kserve_json() -> None:
    rule = re.compile(r"^http-error status (\d+) content-type application/json "
                      r"string '([^']+)'( hdr Retry-After 1)?$")
    lines = [line for line in _section(render(ProxySettings(timeout_server_s=42), NODES),
                                       "defaults") if line.startswith("http-error")]
    matches = [rule.match(line) for line in lines]
    assert all(matches), lines
    errors = {m[1]: (orjson.loads(m[2])["error"], bool(m[3])) for m in matches if m}
    assert sorted(errors) == ["500", "502", "503", "504"]
    assert errors["504"][0].endswith("did not answer within 42 s")
    assert errors["503"] == ("no node can take this request now (all are down, draining or "
                             "full); retry later", True)
    assert not any(retry for status, (_, retry) in errors.items() if status != "503")


def test_the_buffer_size_is_a_setting_within_bounds() -> None:
    assert "    tune.bufsize 16384" in render(ProxySettings(), NODES).splitlines()
    assert "    tune.bufsize 65536" in render(ProxySettings(buffer_kib=64), NODES).splitlines()
    for kib in (4, 2048):
        with pytest.raises(ValueError, match="the proxy's buffer must be 8-1024 KiB"):
            ProxySettings(buffer_kib=kib)


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="HAProxy is not installed")
@pytest.mark.parametrize("nodes", [NODES, Discovery("localhost", slots=4)],
                         ids=["nodes", "dns"])
def test_haproxy_accepts_the_configuration(tmp_path: Path, nodes: list[Node] | Discovery) -> None:
    config = tmp_path / "haproxy.cfg"
    config.write_text(render(ProxySettings(stats_socket=str(tmp_path / "sock"),
                                           stats_port=9999), nodes))
    checked = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True,
                             text=True, check=False)
    assert checked.returncode == 0, checked.stderr
    assert "WARNING" not in checked.stderr, checked.stderr


def test_statefulset_pods_get_fixed_ring_ids_every_proxy_shares() -> None:
    text = render(ProxySettings(), Discovery("svc.ns.svc.cluster.local", slots=3,
                                             statefulset="serval-node"))
    assert "server-template" not in text and "accepted_payload_size 8192" in text
    home = [line for line in _section(text, "backend http_home") if line.startswith("server ")]
    assert [line.split()[1:4] for line in home] == [
        ["serval-node-0", "serval-node-0.svc.ns.svc.cluster.local:8000", "id"],
        ["serval-node-1", "serval-node-1.svc.ns.svc.cluster.local:8000", "id"],
        ["serval-node-2", "serval-node-2.svc.ns.svc.cluster.local:8000", "id"]]
    assert [line.split(" id ")[1].split()[0] for line in home] == ["1", "2", "3"]
    grpc = [line for line in _section(text, "backend grpc_spread") if line.startswith("server ")]
    assert all(line.endswith(" port 8000 check-proto h1") for line in grpc)  # its HTTP probe


@pytest.mark.parametrize(("settings", "message"), [
    ({"http_port": 70000}, "--http-port 70000 is outside 1-65535"),
    ({"grpc_port": 0}, "--grpc-port 0 is outside 1-65535"),
    ({"stats_port": 99999}, "--stats-port 99999 is outside 1-65535"),
    ({"threads": 100000}, "proxy threads must be 1-64"),
    ({"threads": 0}, "proxy threads must be 1-64"),
    ({"host": "bad host"}, "the proxy's host 'bad host' is not a host name"),
    ({"stats_socket": "/tmp/a b"}, "the stats socket path '/tmp/a b' must be"),
    ({"http_port": 8000, "grpc_port": 8000}, "--http-port and --grpc-port are both 8000"),
    ({"grpc_port": None, "stats_port": 8000}, "--http-port and --stats-port are both 8000"),
])
def test_proxy_settings_refuse_what_haproxy_would(settings: dict[str, object], message: str
                                                  ) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ProxySettings(**settings)  # type: ignore[arg-type]


def test_discovery_ports_are_checked() -> None:
    with pytest.raises(ValueError, match="--node-http-port 70000 is outside 1-65535"):
        Discovery("svc.local", http_port=70000)
