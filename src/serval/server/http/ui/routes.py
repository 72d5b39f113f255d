"""Routes of the status page: `/` and `/ui` (static assets), `/status...` (JSON, `read` scope).

    GET /status                      server summary (uptime, rates, latency, memory, events)
    GET /status/models?q=&state=&sort=&order=&page=&per_page=    one page of the model table
    GET /status/models/{name}        one model: versions, recent series, batch sizes, events
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from urllib.parse import parse_qsl

import orjson

from serval.errors import InvalidInput, shown
from serval.server.http.errors import JSON_HEADERS, Headers, error_body, method_not_allowed
from serval.server.http.ui.status import PageQuery, ServerStatus

Reply = tuple[int, bytes, Headers]

_CONTENT_TYPES = {
    "html": b"text/html; charset=utf-8", "js": b"text/javascript; charset=utf-8",
    "css": b"text/css; charset=utf-8", "svg": b"image/svg+xml", "png": b"image/png",
}
_ASSET_HEADERS: Headers = [
    (b"cache-control", b"no-cache"),
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy",
     b"default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'"),
]


class StatusRoutes:
    """Answers the status page's requests; the caller checks auth for the JSON (`read`)."""

    def __init__(self, status: ServerStatus) -> None:
        self.status = status

    @staticmethod
    def is_asset(parts: list[str]) -> bool:
        """`/`, `/ui`, `/ui/` and `/ui/<file>`: open (they hold no data)."""
        return parts == [""] or parts[0] == "ui"

    def asset(self, method: str, parts: list[str]) -> Reply:
        if method != "GET":
            return method_not_allowed(method, "the status page", "GET")
        name = "index.html" if parts in ([""], ["ui"], ["ui", ""]) else "/".join(parts[1:])
        body = _asset(name)
        if body is None:
            return 404, error_body(f"no status page asset {shown(name, 80)}; the page's files "
                                   f"are {', '.join(sorted(_assets()))}"), list(JSON_HEADERS)
        kind = _CONTENT_TYPES[name.rsplit(".", 1)[-1]]
        return 200, body, [(b"content-type", kind), *_ASSET_HEADERS]

    def json(self, method: str, parts: list[str], query: str) -> Reply:
        """parts: the path after `status` ([] / [models] / [models, name])."""
        if method != "GET":
            return method_not_allowed(method, "/status (use GET)", "GET")
        params = _params(query)
        if parts == []:
            _no_params(params, "/status")
            doc = self.status.summary()
        elif parts == ["models"]:
            doc = self.status.models_page(PageQuery.parse(params))
        elif len(parts) == 2 and parts[0] == "models":
            _no_params(params, "/status/models/{name}")
            doc = self.status.model_detail(parts[1])
        else:
            return 404, error_body(f"no route for GET /status/{'/'.join(parts)}"), list(
                JSON_HEADERS)
        return 200, orjson.dumps(doc), [*JSON_HEADERS, (b"cache-control", b"no-store")]


def _asset(name: str) -> bytes | None:
    """A file shipped under static/; None for any other name. The client's name is only looked
    up in the table, never joined to a path nor kept, so no name reaches the file system."""
    return _assets().get(name)


@cache
def _assets() -> dict[str, bytes]:
    """Every servable file under static/ by name, read once (a fixed, small table)."""
    static = resources.files("serval.server.http.ui").joinpath("static")
    return {
        entry.name: entry.read_bytes() for entry in static.iterdir()
        if entry.is_file() and not entry.name.startswith(".")
        and entry.name.rsplit(".", 1)[-1] in _CONTENT_TYPES
    }


def _params(query: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=False,
                          max_num_fields=20)
    except ValueError as exc:
        raise InvalidInput(f"bad query string: {exc}") from None
    params: dict[str, str] = {}
    for key, value in pairs:
        if key in params:
            raise InvalidInput(f"query parameter '{key}' given twice")
        params[key] = value
    return params


def _no_params(params: dict[str, str], route: str) -> None:
    if params:
        raise InvalidInput(f"{route} takes no query parameters, got {', '.join(sorted(params))}")
