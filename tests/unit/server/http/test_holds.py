"""A connection's Retry-After holds: per model, bounded, expiring."""

from __future__ import annotations

import orjson
import pytest

from serval.server.http.holds import RetryHolds, refusal_scope, too_early

pytestmark = pytest.mark.unit

INFER_A = "/v2/models/a/infer"
RETRY_2 = [(b"content-type", b"application/json"), (b"retry-after", b"2")]


def test_the_scope_is_the_model_a_path_names_else_the_path() -> None:
    assert refusal_scope("/v2/models/a/infer") == "a"
    assert refusal_scope("/v2/models/a/versions/3/infer") == "a"
    assert refusal_scope("/v2/models/a") == "a"
    assert refusal_scope("/v2/health/ready") == "/v2/health/ready"


def test_a_hold_covers_its_model_until_retry_after_and_nothing_else() -> None:
    holds = RetryHolds()
    holds.note(INFER_A, RETRY_2, now=100.0)
    assert holds.wait_s("/v2/models/a/versions/1/infer", 100.5) == (1.5, b"2")
    assert holds.wait_s("/v2/models/b/infer", 100.5) is None
    assert holds.wait_s("/v2/health/ready", 100.5) is None
    assert holds.wait_s(INFER_A, 102.0) is None  # elapsed


def test_an_answer_without_retry_after_holds_nothing() -> None:
    holds = RetryHolds()
    holds.note(INFER_A, [(b"content-type", b"application/json")], now=0.0)
    assert holds.wait_s(INFER_A, 0.0) is None


def test_holds_are_bounded_expired_ones_go_first_then_the_oldest() -> None:
    holds = RetryHolds()
    holds.note("/v2/models/expired/infer", [(b"retry-after", b"1")], now=0.0)
    for i in range(15):
        holds.note(f"/v2/models/m{i}/infer", RETRY_2, now=5.0)
    holds.note("/v2/models/new/infer", RETRY_2, now=5.5)  # the 17th: the expired one goes
    assert len(holds.held) == 16 and "expired" not in holds.held
    holds.note("/v2/models/newer/infer", RETRY_2, now=5.6)  # none expired: the oldest goes
    assert len(holds.held) == 16 and "m0" not in holds.held
    assert holds.wait_s("/v2/models/m1/infer", 5.6) is not None
    for i in range(10_000):  # a client refused for ever more models keeps the bound
        holds.note(f"/v2/models/x{i}/infer", RETRY_2, now=6.0)
    assert len(holds.held) == 16


def test_the_late_answer_names_the_model_and_repeats_retry_after() -> None:
    status, body, headers = too_early(INFER_A, b"3")
    assert status == 429 and (b"retry-after", b"3") in headers
    message = orjson.loads(body)["error"]
    assert "model 'a'" in message and "before its Retry-After elapsed" in message
