"""A request's deadline: the earliest the client set, the server default only without one."""

from __future__ import annotations

import pytest

from serval.errors import InvalidInput
from serval.protocol.deadlines import deadline_after, may_set_timeout, request_deadline
from serval.protocol.types import InferRequest

pytestmark = pytest.mark.unit

DEFAULT_NS = 5_000_000


def _request(**parameters: object) -> InferRequest:
    return InferRequest(inputs={}, parameters=dict(parameters))


def test_the_earliest_of_the_transports_and_the_requests_own_wins() -> None:
    assert request_deadline(_request(timeout=1_000), 100, 10_000_000, DEFAULT_NS) == 1_000_100
    assert request_deadline(_request(timeout=1_000_000), 100, 10_000, DEFAULT_NS) == 10_000


def test_the_server_default_applies_only_to_a_request_that_set_none() -> None:
    assert request_deadline(_request(), 100, None, DEFAULT_NS) == 100 + DEFAULT_NS
    assert request_deadline(_request(), 100, None, 0) is None
    assert request_deadline(_request(), 100, 7_000, DEFAULT_NS) == 7_000
    assert request_deadline(_request(timeout=0), 100, None, DEFAULT_NS) is None  # 0: none


@pytest.mark.parametrize("value", [-1, 1.5, "10", True, None])
def test_a_timeout_must_be_a_non_negative_integer_of_microseconds(value: object) -> None:
    if value is None:
        assert request_deadline(_request(timeout=None), 0, None, 0) is None
        return
    with pytest.raises(InvalidInput, match="non-negative integer of microseconds"):
        request_deadline(_request(timeout=value), 0, None, 0)


def test_a_huge_transport_timeout_is_capped_not_overflowed() -> None:
    assert deadline_after(0, None) is None
    assert deadline_after(0, 2.5) == 2_500_000
    assert deadline_after(0, float("inf")) == deadline_after(0, 1e300)


def test_a_body_may_set_its_timeout_only_if_it_says_so_or_is_compressed() -> None:
    assert may_set_timeout(b'{"parameters": {"timeout": 5}}', None, b"")
    assert not may_set_timeout(b'{"inputs": []}', None, b"")
    assert not may_set_timeout(b'{"inputs": []}\x00"timeout"', 14, b"")  # binary part
    assert may_set_timeout(b"\x1f\x8b", None, b"gzip")
