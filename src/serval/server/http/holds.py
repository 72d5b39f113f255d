"""What a connection was told to wait for: after a 429 (or a 503 with Retry-After), a request
for the same model sent on that connection before the Retry-After elapses is refused when it
elapses, unread by the app. A client that hammers gets one answer per Retry-After; other models
and the server's other routes are answered as usual, since a proxy's connection (HAProxy with
`http-reuse`) carries many clients' requests."""

from __future__ import annotations

from serval.server.http.errors import JSON_HEADERS, Headers, Reply, error_body

_SCOPES = 16  # the refused models a connection remembers the Retry-After of


def refusal_scope(path: str) -> str:
    """What a Retry-After holds back: the model a path names (/v2/models/NAME/...), else the
    path itself."""
    if path.startswith("/v2/models/"):
        return path[11:].split("/", 1)[0]
    return path


class RetryHolds:
    """One connection's holds: scope -> (loop time it ends, the Retry-After given), at most
    _SCOPES of them (expired ones go first, then the oldest)."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held: dict[str, tuple[float, bytes]] = {}

    def note(self, path: str, headers: Headers, now: float) -> None:
        """An answer with this status may carry Retry-After: hold its scope that long."""
        for name, value in headers:
            if name == b"retry-after":
                held = self.held
                if len(held) >= _SCOPES:
                    for scope in [scope for scope, (until, _) in held.items() if until <= now]:
                        del held[scope]
                    if len(held) >= _SCOPES:
                        del held[next(iter(held))]
                scope = refusal_scope(path)
                held.pop(scope, None)  # re-inserted: the newest
                held[scope] = (now + float(value), value)
                return

    def wait_s(self, path: str, now: float) -> tuple[float, bytes] | None:
        """(seconds left, Retry-After) when a request for `path` comes too early, else None."""
        hold = self.held.get(refusal_scope(path))
        if hold is None or hold[0] <= now:
            return None
        return hold[0] - now, hold[1]


def too_early(path: str, retry_after: bytes) -> Reply:
    """The 429 a request sent before its Retry-After gets when it elapses."""
    scope = refusal_scope(path)
    what = f"model '{scope}'" if path.startswith("/v2/models/") else f"'{scope}'"
    body = error_body(f"this connection was told to wait before asking for {what} again (a "
                      "429, or a 503 with Retry-After) and sent again before its Retry-After "
                      "elapsed; refused again (wait Retry-After seconds)")
    return 429, body, [*JSON_HEADERS, (b"retry-after", retry_after)]
