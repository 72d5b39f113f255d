"""Header blocks assembled from HEADERS + CONTINUATION, capped as they arrive."""

from __future__ import annotations

import pytest

from serval.http2 import frames as h2
from serval.http2.abuse import AbuseBudget
from serval.http2.blocks import HeaderBlocks

pytestmark = pytest.mark.unit


def test_a_block_split_over_continuations_comes_back_whole_with_the_headers_flags() -> None:
    blocks = HeaderBlocks(100, AbuseBudget(10, 10))
    assert blocks.headers(h2.END_STREAM, 1, b"abc") is None and blocks.open
    assert blocks.continuation(h2.CONTINUATION, 0, 1, b"def") is None
    assert blocks.continuation(h2.CONTINUATION, h2.END_HEADERS, 1, b"g") == (
        h2.END_STREAM, 1, b"abcdefg")
    assert not blocks.open
    assert blocks.headers(h2.END_HEADERS, 3, b"x") == (h2.END_HEADERS, 3, b"x")


def test_a_block_is_capped_while_it_arrives() -> None:
    blocks = HeaderBlocks(8, AbuseBudget(10, 10))
    blocks.headers(0, 1, b"12345")
    with pytest.raises(h2.ProtocolError) as raised:
        blocks.continuation(h2.CONTINUATION, 0, 1, b"6789")  # 9 bytes: never buffered further
    assert raised.value.code == h2.ENHANCE_YOUR_CALM


@pytest.mark.parametrize(("kind", "stream_id"), [(h2.DATA, 1), (h2.CONTINUATION, 3)])
def test_only_a_continuation_of_the_same_stream_may_follow(kind: int, stream_id: int) -> None:
    blocks = HeaderBlocks(100, AbuseBudget(10, 10))
    blocks.headers(0, 1, b"abc")
    with pytest.raises(h2.ProtocolError, match="expected CONTINUATION") as raised:
        blocks.continuation(kind, h2.END_HEADERS, stream_id, b"def")
    assert raised.value.code == h2.PROTOCOL_ERROR


def test_empty_frames_count_against_the_abuse_budget_and_stream_zero_is_refused() -> None:
    blocks = HeaderBlocks(100, AbuseBudget(max_control_frames=2, max_resets=10))
    blocks.headers(0, 1, b"")
    blocks.continuation(h2.CONTINUATION, 0, 1, b"")
    with pytest.raises(h2.ProtocolError) as raised:
        blocks.continuation(h2.CONTINUATION, 0, 1, b"")  # the third empty frame: over budget
    assert raised.value.code == h2.ENHANCE_YOUR_CALM
    with pytest.raises(h2.ProtocolError, match="stream 0"):
        HeaderBlocks(100, AbuseBudget(10, 10)).headers(h2.END_HEADERS, 0, b"x")
