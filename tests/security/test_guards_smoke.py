"""The security harness itself: a quiet server passes the watch it is judged by."""

from __future__ import annotations

import time

import pytest

from tests.conftest import RunningServer
from tests.security.conftest import rss_mib, watch

pytestmark = pytest.mark.integration


def test_a_quiet_server_is_answered_fast_and_keeps_its_memory(guarded: RunningServer) -> None:
    with watch(guarded) as result:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and min(c.calls for c in result.clients) < 5:
            time.sleep(0.05)
    result.assert_held(max_growth_mib=50)
    assert rss_mib(guarded.process.pid) > 10
