"""Free ports: several asked at once are distinct and can be bound."""

from __future__ import annotations

import socket

import pytest

from serval.ports import free_port, free_ports

pytestmark = pytest.mark.unit


def test_ports_asked_together_are_distinct_and_free() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == 64
    with socket.socket() as sock:  # still free once the helper let go of them
        sock.bind(("127.0.0.1", ports[0]))
    assert 0 < free_port() < 65536
