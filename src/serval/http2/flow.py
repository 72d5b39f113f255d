"""Receive-side flow control (RFC 9113 section 5.2): what the peer may still send, and credit
granted back only for bytes the server has consumed."""

from __future__ import annotations

from serval.http2.frames import FLOW_CONTROL_ERROR, ProtocolError


class InboundWindow:
    """One receive window (a stream's or the connection's).

    `receive` charges arriving DATA (False: the peer overran the window); `consume` records bytes
    the server no longer holds and returns the WINDOW_UPDATE increment to send now (0: keep
    collecting, so small reads do not each cost a frame).
    """

    __slots__ = ("available", "owed", "threshold")

    def __init__(self, size: int) -> None:
        self.available = size
        self.owed = 0
        self.threshold = max(1, size // 4)

    def receive(self, size: int) -> bool:
        self.available -= size
        return self.available >= 0

    def consume(self, size: int) -> int:
        owed = self.owed + size
        if owed < self.threshold:
            self.owed = owed
            return 0
        self.owed = 0
        self.available += owed
        return owed


def grow_send_window(window: int, increment: int) -> int:
    """A send window after a WINDOW_UPDATE or SETTINGS change; past 2^31-1 is FLOW_CONTROL_ERROR."""
    window += increment
    if window > 2**31 - 1:
        raise ProtocolError("flow-control window above 2^31-1", FLOW_CONTROL_ERROR)
    return window
