"""The server builder's choices from the config: shared memory on for same-host clients only."""

from __future__ import annotations

import pytest

from serval.config import ServerConfig
from serval.server.build import shared_memory_registry
from serval.server.limits import ReceiveBudget

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("host", "wanted", "workers", "on"), [
    ("127.0.0.1", None, 1, True),
    ("::1", None, 1, True),
    ("localhost", None, 1, True),
    ("0.0.0.0", None, 1, False),  # clients beyond this host: off unless asked for
    ("10.1.2.3", None, 1, False),
    ("0.0.0.0", True, 1, True),
    ("127.0.0.1", False, 1, False),
    ("127.0.0.1", True, 2, False),  # one worker's region would be unknown to the others
])
def test_shared_memory_is_on_for_loopback_listeners_unless_told(
        tmp_path: object, host: str, wanted: bool | None, workers: int, on: bool) -> None:
    config = ServerConfig(repository=str(tmp_path), host=host, shared_memory=wanted,
                          workers=workers, http_port=8000)
    registry = shared_memory_registry(config, ReceiveBudget(1 << 20))
    assert (registry is not None) is on
    if registry is not None:
        registry.close()
