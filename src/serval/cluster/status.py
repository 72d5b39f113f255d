"""A cluster's state per node, from the proxy's stats socket (health, load, where requests
went) and each node's `/status` (resident models, cache hit rate)."""

from __future__ import annotations

import http.client
from dataclasses import dataclass
from typing import Any

import orjson

from serval.cluster.proxy import RuntimeApi, ServerStat


@dataclass(frozen=True)
class NodeStatus:
    name: str
    address: str  # the node's HTTP address as the proxy reaches it
    pid: int | None  # for a local node
    health: str  # the proxy's view: UP, DOWN, DRAIN, MAINT...
    in_flight: int  # requests on it now, through the proxy
    requests: int  # sent to it by the proxy so far (both transports)
    hot: int  # of those, for a model hot enough to spread over nodes (bounded load)
    errors: int
    resident_models: int | None  # None: the node did not answer
    hit_rate: float | None  # requests whose model was already loaded


def cluster_status(api: RuntimeApi, pids: dict[str, int | None] | None = None,
                   token: str | None = None) -> list[NodeStatus]:
    """One row per node (the proxy's `http_home` servers, or template slots with an address)."""
    servers = api.servers()
    by_node: dict[str, list[ServerStat]] = {}
    for stat in servers:
        by_node.setdefault(stat.name, []).append(stat)
    rows = []
    for stat in servers:
        if stat.backend != "http_home" or not stat.address or stat.address.startswith("0.0.0.0"):
            continue
        mine = by_node[stat.name]
        node = _node_status(stat.address, token)
        rows.append(NodeStatus(
            stat.name, stat.address, (pids or {}).get(stat.name), stat.status,
            sum(s.in_flight for s in mine), sum(s.requests for s in mine),
            sum(s.requests for s in mine if s.backend.endswith("_spread")),
            sum(s.errors for s in mine), *node))
    return rows


def _node_status(address: str, token: str | None) -> tuple[int | None, float | None]:
    host, _, port = address.rpartition(":")
    try:
        connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=3)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        connection.request("GET", "/status", headers=headers)
        response = connection.getresponse()
        body = response.read()
        connection.close()
        if response.status != 200:
            return None, None
        summary: dict[str, Any] = orjson.loads(body)
    except (OSError, ValueError):
        return None, None
    resident = int(summary.get("models", {}).get("by_state", {}).get("READY", 0))
    hits, misses = int(summary.get("cache_hits", 0)), int(summary.get("cache_misses", 0))
    return resident, (hits / (hits + misses) if hits + misses else None)
