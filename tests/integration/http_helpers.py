"""Plain HTTP calls for tests that must see exact statuses, headers and bodies."""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def error(self) -> str:
        return str(self.json()["error"])


def call(url: str, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> Reply:
    host, port = url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()},
                     response.read())
    finally:
        connection.close()


def metric(url: str, series: str, missing: float | None = None) -> float:
    """One series' value on /metrics, e.g. `serval_model_loads_total` or
    `serval_connections_closed_total{reason="write stall"}`; `missing` if it is absent (a
    labelled counter not yet counted), else the test fails."""
    for line in call(url, "GET", "/metrics").body.decode().splitlines():
        name, _, value = line.rpartition(" ")
        if name == series:
            return float(value)
    assert missing is not None, f"{series} not in /metrics"
    return missing


def infer(url: str, model: str, doc: Any, headers: dict[str, str] | None = None) -> Reply:
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return call(url, "POST", f"/v2/models/{model}/infer", body, headers)


def _wait_for_gauges(url: str, model: str, gauges: dict[str, int], what: str,
                     timeout_s: float) -> None:
    """Return once every gauge of `model` (version 1) on /metrics reads its value."""
    lines = [f'{gauge}{{model="{model}",version="1"}} {value:.1f}'
             for gauge, value in gauges.items()]
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = call(url, "GET", "/metrics").body.decode()  # one snapshot for every gauge
        if all(line in metrics for line in lines):
            return
        assert time.monotonic() < deadline, f"{model}: {what} in {timeout_s} s"
        time.sleep(0.005)


def wait_until_running(url: str, model: str, timeout_s: float = 30.0) -> None:
    """Return once the server reports a batch of `model` in the engine (its metrics gauge)."""
    _wait_for_gauges(url, model, {"serval_running_batches": 1}, "no batch started", timeout_s)


def wait_until_queued(url: str, model: str, requests: int, timeout_s: float = 30.0) -> None:
    """Return once `requests` requests of `model` wait in its queue (its metrics gauge)."""
    _wait_for_gauges(url, model, {"serval_pending_requests": requests},
                     f"never {requests} requests queued", timeout_s)


def wait_until_idle(url: str, model: str, timeout_s: float = 30.0) -> None:
    """Return once `model` has nothing queued and nothing in the engine: every request it
    queued has been computed (and counted) or dropped, so its counters are final."""
    _wait_for_gauges(url, model, {"serval_pending_requests": 0, "serval_running_batches": 0},
                     "the queue did not drain", timeout_s)


def occupy(url: str, model: str, body: bytes) -> threading.Thread:
    """Send `body` to `model` on a thread; return once the engine is computing its batch."""
    blocker = threading.Thread(target=call, args=(url, "POST", f"/v2/models/{model}/infer",
                                                  body))
    blocker.start()
    wait_until_running(url, model)
    return blocker


def inference_count(url: str, model: str) -> int:
    """Rows the model has computed (Triton's statistics)."""
    stats = call(url, "GET", f"/v2/models/{model}/stats").json()["model_stats"][0]
    return int(stats["inference_count"])
