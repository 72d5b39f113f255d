"""Raw HTTP/1.1 for the attack tests: statuses read off the wire, servers with short timeouts."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from tests.conftest import RunningServer
from tests.security.conftest import INFER_DOC, connect, security_repository

Factory = Callable[..., RunningServer]

# Short timeouts so each attack is judged in seconds; limits small enough to reach quickly.
SHORT = ("--header-timeout-s", "1", "--body-timeout-s", "1", "--keepalive-timeout-s", "2",
         "--max-connections", "200")

BODY = orjson.dumps(INFER_DOC)  # one small valid `linear` request body


def short_server(server_factory: Factory, root: Path, *extra: str) -> RunningServer:
    return server_factory(security_repository(root), *SHORT, *extra)


def statuses(data: bytes) -> list[int]:
    """The status codes of the responses in `data`, in order (1xx included)."""
    found = []
    while data.startswith(b"HTTP/1.1 "):
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head[9:12])
        found.append(status)
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        data = rest[length:]
    return found


def read_until(sock: socket.socket, done: Callable[[bytes], bool],
               timeout_s: float = 5.0) -> bytes:
    """What the server sends until `done(received)` or it closes; fails past timeout_s."""
    sock.settimeout(timeout_s)
    received = b""
    deadline = time.monotonic() + timeout_s
    while not done(received):
        assert time.monotonic() < deadline, f"no answer within {timeout_s} s: {received[:200]!r}"
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            break
        if not chunk:
            break
        received += chunk
    return received


def send_until_refused(sock: socket.socket, head: bytes, filler: bytes, total_bytes: int,
                       chunk_bytes: int = 64 * 1024) -> int:
    """Send head then filler up to total_bytes, stopping when the server stops taking it."""
    sock.sendall(head)
    sent = 0
    block = filler * max(1, chunk_bytes // len(filler))
    sock.settimeout(3.0)
    try:
        while sent < total_bytes:
            sock.sendall(block)
            sent += len(block)
    except (ConnectionResetError, BrokenPipeError, TimeoutError):
        pass
    return sent


def open_partial(port: int, partial: bytes) -> socket.socket:
    sock = connect(port)
    sock.sendall(partial)
    return sock


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll until condition() holds; the seconds it took."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s} s"
        time.sleep(0.02)
    return time.monotonic() - started


def create_token(tokens: Path, *scopes: str) -> str:
    """A new token with these scopes in the tokens file (as `serval token create` makes it)."""
    args = [arg for scope in scopes for arg in ("--scope", scope)]
    result = subprocess.run([sys.executable, "-m", "serval", "token", "create", "--tokens-file",
                             str(tokens), "--name", "-".join(scopes), *args],
                            capture_output=True, text=True, timeout=60, check=True)
    return result.stdout.strip()


def assert_log_quiet(server: RunningServer, max_warnings: int = 20) -> None:
    """Nothing at ERROR; closed abusers are a few rate-limited warning lines, not one each."""
    lines = server.log().splitlines()
    errors = [line for line in lines if '"level":"error"' in line or "Traceback" in line]
    assert not errors, errors[:3]
    warnings = [line for line in lines if '"level":"warning"' in line]
    assert len(warnings) <= max_warnings, warnings[:5]
