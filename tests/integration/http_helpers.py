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


def infer(url: str, model: str, doc: Any, headers: dict[str, str] | None = None) -> Reply:
    body = doc if isinstance(doc, bytes) else orjson.dumps(doc)
    return call(url, "POST", f"/v2/models/{model}/infer", body, headers)


def wait_until_running(url: str, model: str, timeout_s: float = 30.0) -> None:
    """Return once the server reports a batch of `model` in the engine (its metrics gauge)."""
    running = f'serval_running_batches{{model="{model}",version="1"}} 1.0'
    deadline = time.monotonic() + timeout_s
    while running not in call(url, "GET", "/metrics").body.decode():
        assert time.monotonic() < deadline, f"no batch of {model} started"
        time.sleep(0.005)


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
