"""Plain HTTP calls for tests that must see exact statuses, headers and bodies."""

from __future__ import annotations

import http.client
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
