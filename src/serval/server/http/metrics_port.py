"""The app behind `--metrics-port` (Triton's metrics port, 8002 there): GET /metrics of the
server's app, on the same connections' guards, and nothing else (404 naming the one route)."""

from __future__ import annotations

from serval.auth import ANONYMOUS, Token
from serval.server.http.app import HttpApp
from serval.server.http.errors import JSON_HEADERS, Reply, error_body
from serval.server.http.infer_headers import RawHeaders
from serval.server.http.streamed import StreamedReply


def _is_metrics(path: str) -> bool:
    return path.strip("/") == "metrics"


class MetricsPortApp:
    """Routes /metrics to the server's app (its authorization and its shared, paced render)."""

    def __init__(self, app: HttpApp) -> None:
        self.app = app

    async def handle(self, method: str, path: str, headers: RawHeaders, body: bytes,
                     query: str = "", authorized: Token | None = None
                     ) -> Reply | StreamedReply:
        if _is_metrics(path):
            return await self.app.handle(method, path, headers, body, query, authorized)
        return 404, error_body(f"no route for {method} {path[:200]}: this port "
                               "(--metrics-port) serves GET /metrics only"), list(JSON_HEADERS)

    def precheck(self, method: str, path: str, headers: RawHeaders) -> Reply | Token:
        return self.app.precheck(method, path, headers) if _is_metrics(path) else ANONYMOUS
