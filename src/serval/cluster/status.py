"""A cluster's state per node, from the proxy's stats socket (health, load, where requests
went) and each node's `/status` (resident models, cache hit rate)."""

from __future__ import annotations

import http.client
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson

from serval.cluster.proxy import RuntimeApi, ServerStat

NODE_QUERIES = 16  # nodes asked for their /status at once
NODE_TIMEOUT_S = 3.0


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
    homes = [stat for stat in servers if stat.backend == "http_home" and stat.address
             and not stat.address.startswith("0.0.0.0")]
    # every node at once: one that does not answer costs its timeout once, not once per node
    with ThreadPoolExecutor(max_workers=max(1, min(NODE_QUERIES, len(homes)))) as pool:
        answers = list(pool.map(lambda stat: _node_status(stat.address, token), homes))
    rows = []
    for stat, node in zip(homes, answers, strict=True):
        mine = by_node[stat.name]
        rows.append(NodeStatus(
            stat.name, stat.address, (pids or {}).get(stat.name), stat.status,
            sum(s.in_flight for s in mine), sum(s.requests for s in mine),
            sum(s.requests for s in mine if s.backend.endswith("_spread")),
            sum(s.errors for s in mine), *node))
    return rows


def _node_status(address: str, token: str | None) -> tuple[int | None, float | None]:
    host, _, port = address.rpartition(":")
    try:
        connection = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=NODE_TIMEOUT_S)
        headers = {"authorization": f"Bearer {token}"} if token else {}
        connection.request("GET", "/status", headers=headers)
        response = connection.getresponse()
        body = response.read()
        connection.close()
        if response.status != 200:
            return None, None
        summary: Any = orjson.loads(body)
        resident = int(summary.get("models", {}).get("by_state", {}).get("READY", 0))
        hits, misses = int(summary.get("cache_hits", 0)), int(summary.get("cache_misses", 0))
    except (OSError, ValueError, TypeError, AttributeError):  # not a Serval node's summary
        return None, None
    return resident, (hits / (hits + misses) if hits + misses else None)
