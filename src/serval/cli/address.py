"""Server addresses on the command line (`repo --server`, `loadtest URL`, `--metadata-url`):
`host:port` or `http://host:port`, checked whole before a command changes or starts anything.
The one parser every such flag uses."""

from __future__ import annotations

from urllib.parse import urlsplit

import typer

EXAMPLES = "host:port or http://host:port, e.g. localhost:8000"


def parse_address(text: str) -> tuple[str, int]:
    """TEXT as (host, port); ValueError with the reason when it is not one server's address
    over plain HTTP (another scheme, no or a bad port, a path, spaces)."""
    if not text or any(c.isspace() for c in text):
        raise ValueError(f"{text!r} is not an address ({EXAMPLES})")
    url = text if "://" in text else f"http://{text}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # '[::1', 'localhost:abc', a port past 65535
        raise ValueError(f"{text!r} is not an address ({EXAMPLES}): {exc}") from None
    if parts.scheme != "http":
        raise ValueError(f"{text!r}: only http:// is supported, not {parts.scheme}://")
    if not parts.hostname or not port:
        raise ValueError(f"{text!r} needs a host and a port from 1 to 65535 ({EXAMPLES})")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"{text!r}: give only the server's address ({EXAMPLES}), no path")
    return parts.hostname, port


def address(text: str) -> str:
    """A flag's parser: the address as given, refused with its reason when malformed."""
    try:
        parse_address(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return text


def host_port(text: str) -> str:
    """'host:port' of an address, IPv6 hosts bracketed (for building URLs)."""
    host, port = parse_address(text)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
