"""HTTP/2 abuse budgets: control frames and resets past their budget end with ENHANCE_YOUR_CALM."""

from __future__ import annotations

import pytest

from serval.http2 import frames as h2
from serval.http2.abuse import AbuseBudget

pytestmark = pytest.mark.unit


def test_abuse_budgets_end_with_enhance_your_calm() -> None:
    budget = AbuseBudget(max_control_frames=3, max_resets=1)
    for _ in range(3):
        budget.control_frame("PING")
    with pytest.raises(h2.ProtocolError) as raised:
        budget.control_frame("PING")
    assert raised.value.code == h2.ENHANCE_YOUR_CALM
    budget.new_window()
    budget.reset_stream("reset")
    with pytest.raises(h2.ProtocolError):
        budget.reset_stream("reset")
