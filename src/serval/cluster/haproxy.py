"""The HAProxy configuration in front of Serval nodes: a pure function of the node list.

Routing (docs/design.md, "Scaling out"):
- The model name is the key: REST from the path (`/v2/models/<name>/...`,
  `/v2/repository/models/<name>/...`), gRPC from field 1 of the first message, read from its
  first bytes (`bytes(5),protobuf(1)`: a message larger than the proxy's buffer is routed too;
  the `serval-model` header wins when present, e.g. for compressed messages and streams).
- Two backends over the same nodes and the same ring (same server ids): `home` hashes every
  model to one node (pure consistent hashing: its requests land where it is resident); a model
  whose recent rate passes `hot_rate` (a stick table counts requests per model) goes to
  `spread`, the same ring with bounded load (`hash-balance-factor`), so a hot model starts on its
  home node and spills to the next nodes on the ring, which load it lazily.
- Active health checks on `/v2/health/ready` in every backend, and 3 failed connections in a
  row take a node out at once (a killed node leaves the ring before a probe notices); an agent
  check answered by the node (`drain` while it drains, a weight from its free queue and memory
  in `spread`).
- Connection failures, empty responses and 503s are retried on another node; repository
  control and streams are never retried after they were sent.
- The proxy's own 500/502/503/504 answers are KServe errors (`{"error": ...}`), not HTML.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import orjson

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_HOST = re.compile(r"^[A-Za-z0-9.:_\[\]-]{1,253}$")
GRPC_SERVICE = "/inference.GRPCInferenceService/"
# unary calls whose request's field 1 is the model's name
_GRPC_BY_NAME = ("ModelInfer", "ModelMetadata", "ModelReady", "ModelConfig",
                 "ModelStatistics")
_GRPC_CONTROL = ("RepositoryModelLoad", "RepositoryModelUnload")  # model name: field 2
MODEL_HEADER = "serval-model"
# a field of the call's message, read past the 5-byte gRPC prefix from whatever part of the body
# the buffer holds (`ungrpc` needs the whole message: larger ones would go round robin)
_FIELD = "req.body,bytes(5),protobuf"
MIN_BUFFER_KIB, MAX_BUFFER_KIB = 8, 1024
MAX_THREADS = 64  # HAProxy's MAX_THREADS in common builds (`haproxy -vv`); nbthread past it
# is refused
RING_WEIGHT = 64  # x 16 ring points per node in HAProxy: smooth shares, agent steps of 25%


@dataclass(frozen=True)
class Node:
    """One Serval node as the proxy sees it. `id` fixes its ring points: every proxy in front
    of the cluster must give a node the same id (and ids must never be reused for another)."""

    name: str
    host: str
    http_port: int
    grpc_port: int | None = None
    agent_port: int | None = None
    id: int = 1

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"node name {self.name!r}: use 1-64 letters, digits, '.', '_', '-'")
        if not _HOST.match(self.host):
            raise ValueError(f"node {self.name}: {self.host!r} is not a host name or address")
        for port in (self.http_port, self.grpc_port, self.agent_port):
            check_port(port, f"node {self.name}: port")
        if self.id < 1:
            raise ValueError(f"node {self.name}: id must be >= 1")

    @classmethod
    def parse(cls, spec: str, id: int) -> Node:
        """`[NAME=]HOST:HTTP[:GRPC[:AGENT]]` (`-` skips a port), e.g. `n1=10.0.0.5:8000:8001`."""
        name, _, address = spec.rpartition("=")
        host, *ports = _split_address(address)
        if not 1 <= len(ports) <= 3 or not ports[0].isdigit():
            raise ValueError(f"node {spec!r}: expected [NAME=]HOST:HTTP[:GRPC[:AGENT]]")
        numbers = [int(p) if p.isdigit() else None for p in ports] + [None, None]
        if any(p not in ("-", "") and not p.isdigit() for p in ports):
            raise ValueError(f"node {spec!r}: ports are numbers (or '-' for none)")
        return cls(name or f"node{id}", host, numbers[0] or 0, numbers[1], numbers[2], id)


def _split_address(address: str) -> list[str]:
    """`host:p1:p2`, `[v6::addr]:p1:p2` -> [host, p1, p2]."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        return [host, *rest.lstrip(":").split(":")] if rest else [host]
    return address.split(":")


@dataclass(frozen=True)
class Discovery:
    """Nodes found through DNS (e.g. a Kubernetes headless Service).

    With `statefulset` (the pods' name prefix), one server per pod `<statefulset>-<i>.<name>`
    for i < slots, each with the fixed ring id i+1: every proxy hashes a model to the same pod
    whatever order it saw them come in. Without, `slots` server-template entries filled from
    the name's records in the order the proxy learns them: two proxies that saw the nodes
    arrive differently place models differently (fine for one proxy)."""

    name: str
    slots: int = 16
    http_port: int = 8000
    grpc_port: int | None = 8001
    agent_port: int | None = 8002
    nameservers: tuple[str, ...] = ()  # empty: the proxy's /etc/resolv.conf
    statefulset: str | None = None

    def __post_init__(self) -> None:
        if not _HOST.match(self.name):
            raise ValueError(f"{self.name!r} is not a DNS name")
        if not 1 <= self.slots <= 1024:
            raise ValueError("slots must be 1-1024")
        if self.statefulset is not None and not _NAME.match(self.statefulset):
            raise ValueError(f"{self.statefulset!r} is not a StatefulSet name")
        check_port(self.http_port, "--node-http-port")
        check_port(self.grpc_port, "--node-grpc-port")
        check_port(self.agent_port, "--node-agent-port")


def check_port(port: int | None, what: str) -> None:
    """A TCP port HAProxy can bind or reach: 1-65535 (None: none); ValueError naming WHAT."""
    if port is not None and not 0 < port < 65536:
        raise ValueError(f"{what} {port} is outside 1-65535")


@dataclass(frozen=True)
class ProxySettings:
    """What the proxy listens on and how it balances; every field has a working default."""

    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int | None = 8001
    stats_socket: str | None = None  # the runtime API (a unix socket path); None: none
    stats_port: int | None = None  # HAProxy's own stats page and Prometheus /metrics
    hot_rate: int = 100  # requests per second that make a model hot (spread over nodes)
    balance_factor: int = 125  # a hot model's node takes at most this % of the average
    check_interval_ms: int = 1000
    retries: int = 3
    threads: int = 1
    # one request's buffer: request headers, the retry copy, a gRPC call's first bytes
    buffer_kib: int = 16
    maxconn: int | None = None  # None: HAProxy derives it from the file-descriptor limit
    node_maxconn: int = 1024  # requests in flight to one node; more wait in the proxy
    timeout_client_s: int = 300
    timeout_server_s: int = 300
    header_timeout_s: int = 10  # a client's request headers (slowloris) must arrive within
    extra_global: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.balance_factor and self.balance_factor <= 100:
            raise ValueError("the balance factor must be > 100 (percent of the average load) "
                             "or 0 (off)")
        if self.hot_rate < 1:
            raise ValueError("the hot rate must be >= 1 request per second")
        if self.retries < 0:
            raise ValueError("retries must be >= 0")
        if not 1 <= self.threads <= MAX_THREADS:
            raise ValueError(f"proxy threads must be 1-{MAX_THREADS} (HAProxy's most), got "
                             f"{self.threads}")
        if not _HOST.match(self.host):
            raise ValueError(f"the proxy's host {self.host!r} is not a host name or address")
        if self.stats_socket is not None and (
                not self.stats_socket or any(c.isspace() or c in "#\\'\"" for c in
                                             self.stats_socket)):
            raise ValueError(f"the stats socket path {self.stats_socket!r} must be non-empty "
                             "with no spaces, quotes, '#' or backslashes (HAProxy's syntax)")
        ports = {"--http-port": self.http_port, "--grpc-port": self.grpc_port,
                 "--stats-port": self.stats_port or None}  # stats port 0: no stats page
        for flag, port in ports.items():
            check_port(port, flag)
        taken = [(flag, port) for flag, port in ports.items() if port]
        for index, (flag, port) in enumerate(taken):
            for other, same in taken[index + 1:]:
                if port == same:
                    raise ValueError(f"{flag} and {other} are both {port}: the proxy needs "
                                     "a port for each")
        if not MIN_BUFFER_KIB <= self.buffer_kib <= MAX_BUFFER_KIB:
            raise ValueError(f"the proxy's buffer must be {MIN_BUFFER_KIB}-{MAX_BUFFER_KIB} KiB")


def render(settings: ProxySettings, nodes: list[Node] | Discovery) -> str:
    """The whole haproxy.cfg for these nodes (or this DNS discovery)."""
    if isinstance(nodes, list):
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        ids = [n.id for n in nodes]
        if len(set(ids)) != len(ids):
            raise ValueError("node ids must be unique")
    parts = [_global(settings, nodes), _defaults(settings), _models_table(settings),
             _http_frontend(settings)]
    grpc = settings.grpc_port is not None and _has_grpc(nodes)
    if grpc:
        parts.append(_grpc_frontend(settings))
    for transport in ("http", "grpc") if grpc else ("http",):
        for kind in ("home", "spread"):
            parts.append(_backend(settings, nodes, transport, kind))
    if settings.stats_port:
        parts.append(_stats(settings))
    return "\n".join(parts)


def _has_grpc(nodes: list[Node] | Discovery) -> bool:
    if isinstance(nodes, Discovery):
        return nodes.grpc_port is not None
    return any(n.grpc_port for n in nodes)


def _global(settings: ProxySettings, nodes: list[Node] | Discovery) -> str:
    # HAProxy copies the whole buffer for every request it may retry (L7 retries), so a larger
    # buffer costs proxy CPU on every request (measured: 64 KiB took 9-14 us more than 16 KiB
    # per `mlp` request); a request that does not fit is forwarded but not retried.
    lines = ["global", f"    nbthread {settings.threads}",
             f"    tune.bufsize {settings.buffer_kib * 1024}", "    hard-stop-after 60s"]
    if settings.maxconn:
        lines.append(f"    maxconn {settings.maxconn}")
    if settings.stats_socket:
        lines.append(f"    stats socket {settings.stats_socket} mode 600 level admin "
                     "expose-fd listeners")
    lines += [f"    {line}" for line in settings.extra_global]
    if isinstance(nodes, Discovery):
        servers = " ".join(f"nameserver ns{i} {ns}" for i, ns in enumerate(nodes.nameservers))
        lines += ["", "resolvers dns",
                  "    parse-resolv-conf" if not nodes.nameservers else f"    {servers}",
                  # answers past 512 bytes (about 27 addresses) must not be cut
                  "    accepted_payload_size 8192",
                  "    hold valid 5s", "    hold obsolete 5s", "    resolve_retries 3",
                  "    timeout resolve 1s", "    timeout retry 1s"]
    return "\n".join(lines) + "\n"


def _defaults(s: ProxySettings) -> str:
    return f"""defaults
    mode http
    timeout connect 2s
    timeout client {s.timeout_client_s}s
    timeout server {s.timeout_server_s}s
    timeout http-request {s.header_timeout_s}s
    timeout http-keep-alive 60s
    timeout queue 30s
    timeout check 2s
    timeout tunnel 1h
    http-reuse always
    retries {s.retries}
    option redispatch 1
    retry-on conn-failure empty-response response-timeout 503
{_errors(s)}"""


def _errors(s: ProxySettings) -> str:
    """The proxy's own answers in KServe's error form (`{"error": ...}`), not HAProxy's HTML.
    HAProxy 2.6 still answers a malformed request, headers over its buffer (400) and headers
    too slow to arrive (408) with its HTML pages: its connection layer sends those, and
    configured errors do not reach it."""
    messages = {
        500: "the proxy failed to handle this request",
        502: "bad gateway: the node serving this model sent an invalid response or closed "
             "the connection",
        503: "no node can take this request now (all are down, draining or full); retry later",
        504: f"gateway timeout: the node serving this model did not answer within "
             f"{s.timeout_server_s} s",
    }
    lines = []
    for status, message in messages.items():
        body = orjson.dumps({"error": message}).decode()
        assert "'" not in body  # the body sits in single quotes (HAProxy's strong quoting)
        lines.append(f"    http-error status {status} content-type application/json "
                     f"string '{body}'" + (" hdr Retry-After 1" if status == 503 else ""))
    return "\n".join(lines) + "\n"


def _models_table(s: ProxySettings) -> str:
    # one entry per model: its request rate over the last second (both transports count)
    return """backend models
    stick-table type string len 128 size 200k expire 30s store http_req_rate(1s)
"""


def _route(s: ProxySettings, transport: str) -> str:
    """Rules shared by both frontends once txn.model is set: count, pick home or spread."""
    return f"""    http-request track-sc0 var(txn.model) table models if {{ var(txn.model) -m found }}
    use_backend {transport}_spread if {{ var(txn.model) -m found }} {{ sc0_http_req_rate(models) gt {s.hot_rate} }}
    default_backend {transport}_home
"""  # noqa: E501


def _http_frontend(s: ProxySettings) -> str:
    return f"""frontend http
    bind {_bind(s.host, s.http_port)}
    option forwardfor
    http-request set-var(txn.model) path,field(4,/),url_dec if {{ path_beg /v2/models/ }}
    http-request set-var(txn.model) path,field(5,/),url_dec if {{ path_beg /v2/repository/models/ }}
    http-request disable-l7-retry if {{ path_beg /v2/repository/ }}
{_route(s, "http")}"""


def _grpc_frontend(s: ProxySettings) -> str:
    assert s.grpc_port is not None
    by_name = " ".join(GRPC_SERVICE + m for m in _GRPC_BY_NAME)
    control = " ".join(GRPC_SERVICE + m for m in _GRPC_CONTROL)
    stream = GRPC_SERVICE + "ModelStreamInfer"
    return f"""frontend grpc
    bind {_bind(s.host, s.grpc_port)} proto h2
    acl named_call path {by_name}
    acl control_call path {control}
    acl stream_call path {stream}
    acl model_header req.hdr({MODEL_HEADER}) -m found
    acl compressed req.hdr(grpc-encoding) -m found
    http-request set-var(txn.model) req.hdr({MODEL_HEADER}) if model_header
    http-request wait-for-body time 1s if !model_header named_call || !model_header control_call
    http-request set-var(txn.model) {_FIELD}(1) if !model_header named_call !compressed
    http-request set-var(txn.model) {_FIELD}(2) if !model_header control_call !compressed
    http-request disable-l7-retry if control_call || stream_call
{_route(s, "grpc")}"""


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _backend(s: ProxySettings, nodes: list[Node] | Discovery, transport: str, kind: str) -> str:
    lines = [f"backend {transport}_{kind}",
             "    balance hash var(txn.model)",
             "    hash-type consistent sdbm avalanche"]
    if kind == "spread" and s.balance_factor:
        lines.append(f"    hash-balance-factor {s.balance_factor}")
    # Every backend probes each node's readiness on its HTTP port, and takes a node out of its
    # ring after 3 failed connections in a row. A killed node has nothing in flight, so the
    # bounded-load ring of `spread` would otherwise keep choosing it (and retrying on it) as the
    # least loaded until a probe noticed; a backend that only tracked another's probe saw the
    # same. Costs one probe per node per backend per interval.
    lines += ["    option httpchk GET /v2/health/ready", "    http-check expect status 200"]
    # the node's agent: `drain` when it drains; in spread, a weight from its free capacity
    agent_send = "weight" if kind == "spread" else "state"
    lines.append(f"    default-server check inter {s.check_interval_ms} fall 2 rise 2 "
                 "observe layer4 error-limit 3 on-error mark-down "
                 f"maxconn {s.node_maxconn} weight {RING_WEIGHT} "
                 f"agent-inter {s.check_interval_ms} agent-send \"{agent_send}\\n\""
                 + (" proto h2" if transport == "grpc" else ""))

    def probe(http_port: int) -> str:  # gRPC servers probe the node's HTTP port, in HTTP/1.1
        return f" port {http_port} check-proto h1" if transport == "grpc" else ""

    if isinstance(nodes, Discovery):
        port = nodes.http_port if transport == "http" else nodes.grpc_port
        resolve = " resolvers dns init-addr none resolve-prefer ipv4" + (
            f" agent-check agent-port {nodes.agent_port}" if nodes.agent_port else "")
        for index in range(nodes.slots if nodes.statefulset else 0):
            pod = f"{nodes.statefulset}-{index}"
            lines.append(f"    server {pod} {pod}.{nodes.name}:{port} id {index + 1}"
                         f"{resolve}{probe(nodes.http_port)}")
        if nodes.statefulset is None:
            lines.append(f"    server-template node {nodes.slots} {nodes.name}:{port}"
                         f"{resolve}{probe(nodes.http_port)}")
        return "\n".join(lines) + "\n"
    for node in nodes:
        port = node.http_port if transport == "http" else node.grpc_port
        if port is None:
            continue
        agent = f" agent-check agent-port {node.agent_port}" if node.agent_port else ""
        lines.append(f"    server {node.name} {_bind(node.host, port)} id {node.id}"
                     f"{agent}{probe(node.http_port)}")
    return "\n".join(lines) + "\n"


def _stats(s: ProxySettings) -> str:
    return f"""frontend stats
    bind {_bind(s.host, s.stats_port or 0)}
    http-request use-service prometheus-exporter if {{ path /metrics }}
    stats enable
    stats uri /
    stats refresh 5s
"""
