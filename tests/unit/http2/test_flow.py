"""HTTP/2 flow control: receive windows credited in batches as data is consumed; the send window
bounded."""

from __future__ import annotations

import pytest

from serval.http2 import frames as h2
from serval.http2.flow import InboundWindow, grow_send_window

pytestmark = pytest.mark.unit


def test_receive_windows_credit_consumed_bytes_in_batches() -> None:
    window = InboundWindow(1000)
    assert window.receive(1000) and not window.receive(1)
    assert window.consume(100) == 0  # below a quarter: kept
    assert window.consume(200) == 300 and window.available == 299
    with pytest.raises(h2.ProtocolError):
        grow_send_window(2**31 - 10, 10)
