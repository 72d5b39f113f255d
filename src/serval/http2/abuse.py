"""Abuse budgets of one HTTP/2 connection, per time window, as the C servers keep them.

Frames that cost the server work but carry no request (PING, SETTINGS, PRIORITY, empty DATA,
HEADERS and CONTINUATION, unknown types) and streams the client resets before their answer (the
rapid-reset pattern, CVE-2023-44487) are counted; past either budget the connection is ended with
GOAWAY(ENHANCE_YOUR_CALM). The owner calls `new_window` every window.
"""

from __future__ import annotations

from serval.http2.frames import ENHANCE_YOUR_CALM, ProtocolError


class AbuseBudget:
    """Counters against per-window budgets; over budget raises ProtocolError(ENHANCE_YOUR_CALM)."""

    __slots__ = ("control_frames", "max_control_frames", "max_resets", "resets")

    def __init__(self, max_control_frames: int, max_resets: int) -> None:
        self.max_control_frames, self.max_resets = max_control_frames, max_resets
        self.control_frames = self.resets = 0

    def control_frame(self, what: str) -> None:
        self.control_frames += 1
        if self.control_frames > self.max_control_frames:
            raise ProtocolError(f"more than {self.max_control_frames} control or empty frames "
                                f"in one window (last: {what})", ENHANCE_YOUR_CALM)

    def reset_stream(self, what: str) -> None:
        self.resets += 1
        if self.resets > self.max_resets:
            raise ProtocolError(f"more than {self.max_resets} streams {what} in one window",
                                ENHANCE_YOUR_CALM)

    def new_window(self) -> None:
        self.control_frames = self.resets = 0
