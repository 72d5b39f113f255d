"""Free TCP ports for the processes Serval starts itself (local cluster nodes, servers under
test): several at once are distinct, because each socket is held until all are chosen."""

from __future__ import annotations

import contextlib
import socket

LOOPBACK = "127.0.0.1"


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """`count` distinct ports free on `host` now (the kernel cannot hand one out twice while
    the sockets that found them are open)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def free_port(host: str = LOOPBACK) -> int:
    return free_ports(1, host)[0]
