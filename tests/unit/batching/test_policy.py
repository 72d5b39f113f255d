"""Batch formation and admission: pure functions of the queue, the clock and measured times."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from serval.batching.policy import (
    SIZE_CLASSES,
    PendingRequest,
    ServiceTimes,
    batch_limit,
    batch_ns,
    dispatch_delay_ns,
    expected_wait_ns,
    is_live,
    merged_rows,
    record_batch,
    refusal_retry_after_s,
    signature_of,
    size_class,
    take_batch,
)

pytestmark = pytest.mark.unit

Make = Callable[..., PendingRequest]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def make(loop: asyncio.AbstractEventLoop) -> Make:
    """A queued request of `rows` rows; kind 'a' and 'b' have different signatures."""

    def make(rows: int = 1, kind: str = "a", enqueued_ns: int = 0,
             deadline_ns: int | None = None) -> PendingRequest:
        width = {"a": 3, "b": 5}[kind]
        inputs = {"x": np.zeros((rows, width), dtype=np.float32)}
        return PendingRequest(inputs, rows, signature_of(inputs), loop.create_future(),
                              enqueued_ns, deadline_ns)

    return make


# --- signature_of ------------------------------------------------------------------------------


def test_signature_is_sorted_names_dtypes_and_non_batch_dims() -> None:
    inputs = {"b": np.zeros((4,), np.int64), "a": np.zeros((4, 2, 3), np.float32)}
    assert signature_of(inputs) == (("a", "<f4", (2, 3)), ("b", "<i8", ()))


def test_signature_ignores_the_batch_dimension() -> None:
    assert signature_of({"x": np.zeros((1, 3))}) == signature_of({"x": np.zeros((9, 3))})


@pytest.mark.parametrize("other", [
    {"x": np.zeros((2, 4), np.float32)},
    {"x": np.zeros((2, 3), np.float64)},
    {"y": np.zeros((2, 3), np.float32)},
    {"x": np.zeros((2, 3), np.float32), "y": np.zeros((2, 3), np.float32)},
], ids=["dims", "dtype", "name", "extra-input"])
def test_signature_differs_when_requests_cannot_share_a_batch(other: dict[str, np.ndarray]
                                                              ) -> None:
    assert signature_of({"x": np.zeros((2, 3), np.float32)}) != signature_of(other)


# --- take_batch --------------------------------------------------------------------------------


def test_take_batch_respects_max_rows_and_leaves_the_rest_in_order(make: Make) -> None:
    requests = [make() for _ in range(5)]
    queue = deque(requests)
    assert take_batch(queue, 3) == requests[:3]
    assert list(queue) == requests[3:]


def test_take_batch_skips_other_signatures_keeping_their_order(make: Make) -> None:
    a1, b1, a2, b2, a3 = (make(kind=k) for k in "ababa")
    queue = deque([a1, b1, a2, b2, a3])
    assert take_batch(queue, 10) == [a1, a2, a3]
    assert list(queue) == [b1, b2]


def test_take_batch_stops_before_overflowing_and_keeps_fifo_order(make: Make) -> None:
    first, too_big, would_fit = make(2), make(2), make(1)
    queue = deque([first, too_big, would_fit])
    assert take_batch(queue, 3) == [first]
    # The 1-row request would fit, but taking it would overtake the 2-row one.
    assert list(queue) == [too_big, would_fit]


def test_take_batch_puts_skipped_requests_back_before_the_rest(make: Make) -> None:
    head, other, too_big, tail = make(2), make(kind="b"), make(2), make(1)
    queue = deque([head, other, too_big, tail])
    assert take_batch(queue, 3) == [head]
    assert list(queue) == [other, too_big, tail]


def test_take_batch_fills_exactly_to_max_rows(make: Make) -> None:
    requests = [make(2), make(1), make(3), make(1)]
    queue = deque(requests)
    batch = take_batch(queue, 6)
    assert batch == requests[:3] and merged_rows(batch) == 6
    assert list(queue) == requests[3:]


@pytest.mark.parametrize("head_rows", [4, 7])
def test_take_batch_always_returns_the_head(make: Make, head_rows: int) -> None:
    head, rest = make(head_rows), make(1)
    queue = deque([head, rest])
    assert take_batch(queue, 4) == [head]
    assert list(queue) == [rest]


def test_take_batch_of_a_single_request(make: Make) -> None:
    only = make(kind="b")
    queue = deque([only])
    assert take_batch(queue, 8) == [only]
    assert not queue


# --- dispatch_delay_ns -------------------------------------------------------------------------


def test_no_configured_delay_dispatches_at_once(make: Make) -> None:
    queue = deque([make(enqueued_ns=1_000)])
    assert dispatch_delay_ns(queue, 1, 8, 0, now_ns=1_000) == 0


@pytest.mark.parametrize(("now_ns", "expected"), [
    (100, 1_000), (400, 700), (1_099, 1), (1_100, 0), (50_000, 0),
])
def test_delay_is_what_remains_of_the_heads_wait(make: Make, now_ns: int, expected: int) -> None:
    queue = deque([make(enqueued_ns=100), make(enqueued_ns=900)])
    assert dispatch_delay_ns(queue, 2, 8, 1_000, now_ns) == expected


@pytest.mark.parametrize("queued_rows", [8, 9])
def test_a_full_batch_dispatches_at_once(make: Make, queued_rows: int) -> None:
    queue = deque([make(8, enqueued_ns=100)])
    assert dispatch_delay_ns(queue, queued_rows, 8, 1_000, now_ns=100) == 0


def test_a_queue_that_fills_a_preferred_size_dispatches_at_once(make: Make) -> None:
    queue = deque([make(2, enqueued_ns=100), make(2, enqueued_ns=100)])
    assert dispatch_delay_ns(queue, 4, 16, 1_000, 100, preferred=(4, 8)) == 0
    assert dispatch_delay_ns(queue, 3, 16, 1_000, 100, preferred=(4, 8)) == 1_000


@pytest.mark.parametrize(("queued_rows", "preferred", "limit"), [
    (10, (4, 8), 8), (7, (4, 8), 4), (3, (4, 8), 16), (20, (4, 32), 4), (5, (), 16),
])
def test_the_batch_takes_the_largest_preferred_size_the_queue_fills(
        queued_rows: int, preferred: tuple[int, ...], limit: int) -> None:
    assert batch_limit(queued_rows, 16, preferred) == limit


# --- is_live -----------------------------------------------------------------------------------


def test_pending_request_without_deadline_is_live(make: Make) -> None:
    assert is_live(make(), now_ns=10**18)


@pytest.mark.parametrize("finish", [
    lambda f: f.cancel(),
    lambda f: f.set_result({}),
    lambda f: f.set_exception(RuntimeError("gone")),
], ids=["cancelled", "result", "exception"])
def test_done_future_is_not_live(make: Make, finish: Callable[[asyncio.Future[object]], object]
                                 ) -> None:
    request = make()
    finish(request.future)
    assert not is_live(request, now_ns=0)


@pytest.mark.parametrize(("now_ns", "live"), [(999, True), (1_000, False), (5_000, False)])
def test_request_is_dead_from_its_deadline_on(make: Make, now_ns: int, live: bool) -> None:
    assert is_live(make(deadline_ns=1_000), now_ns) is live


# --- admission by expected wait ----------------------------------------------------------------

MS = 1_000_000


def measured(*batches: tuple[int, int]) -> ServiceTimes:
    """Service times after these (rows, ns) batches."""
    times = ServiceTimes.empty()
    for rows, ns in batches:
        record_batch(times, rows, ns)
    return times


def test_size_classes_are_powers_of_two_and_capped() -> None:
    assert [size_class(r) for r in (1, 2, 3, 4, 5, 8, 9, 128, 129)] == [0, 1, 2, 2, 3, 3, 4, 7, 8]
    assert size_class(10**9) == SIZE_CLASSES - 1


def test_the_first_batch_sets_its_class_and_later_ones_move_it_by_the_ewma() -> None:
    times = measured((128, 30 * MS))
    assert batch_ns(times, 128) == 30 * MS
    record_batch(times, 128, 40 * MS, alpha=0.5)
    assert batch_ns(times, 128) == 35 * MS


def test_nothing_measured_gives_no_estimate_and_no_refusal() -> None:
    times = ServiceTimes.empty()
    assert batch_ns(times, 8) is None
    wait = expected_wait_ns(times, queued_rows=10_000, rows=1, max_batch_rows=128,
                            instances=1, running_left_ns=0.0)
    assert wait is None
    assert refusal_retry_after_s(0, 1, wait) == 0.0


def test_unmeasured_sizes_borrow_the_nearest_measured_class_unscaled() -> None:
    times = measured((16, 10 * MS))
    assert batch_ns(times, 64) == 10 * MS  # a lower bound above: never refuse on a guess
    assert batch_ns(times, 1) == 10 * MS  # a batch's fixed overhead, below
    assert batch_ns(measured((12, 12 * MS)), 16) == pytest.approx(16 * MS)  # in its own class


def test_a_deep_queue_measured_only_at_batch_one_is_not_priced_one_request_at_a_time() -> None:
    # A slow first batch of one (the loop was busy) must not refuse a queue of 992 that drains
    # in 16 batches of 64: 16 x 25 ms fits a 5 s deadline.
    times = measured((1, 25 * MS))
    wait = expected_wait_ns(times, queued_rows=992, rows=1, max_batch_rows=64, instances=1,
                            running_left_ns=0.0)
    assert wait == pytest.approx(16 * 25 * MS)
    assert refusal_retry_after_s(0, 5_000 * MS, wait) == 0.0


def test_expected_wait_counts_full_batches_the_partial_one_and_the_running_remainder() -> None:
    times = measured((128, 30 * MS), (4, 5 * MS))
    # 260 queued + 1 of ours = two full batches of 128 and one of 5 rows (at least 4 rows' time).
    wait = expected_wait_ns(times, queued_rows=260, rows=1, max_batch_rows=128, instances=1,
                            running_left_ns=12 * MS)
    assert wait == pytest.approx(12 * MS + 2 * 30 * MS + 5 * MS)


def test_instances_share_the_queue() -> None:
    times = measured((128, 30 * MS))
    one = expected_wait_ns(times, 1023, 1, 128, 1, 0.0)
    two = expected_wait_ns(times, 1023, 1, 128, 2, 0.0)
    assert one == 8 * 30 * MS and two == 4 * 30 * MS


def test_unbatched_models_wait_one_run_per_request_ahead() -> None:
    times = measured((1, 2 * MS))
    assert expected_wait_ns(times, 9, 1, 1, 1, 0.0) == 10 * 2 * MS


def test_a_request_whose_deadline_the_wait_meets_is_admitted() -> None:
    now = 1_000 * MS
    assert refusal_retry_after_s(now, now + 100 * MS, 99 * MS) == 0.0
    assert refusal_retry_after_s(now, now + 100 * MS, 100 * MS) == 0.0
    assert refusal_retry_after_s(now, None, 10**12) == 0.0  # no deadline: nothing to miss


def test_a_request_whose_deadline_the_wait_misses_is_refused_with_the_excess_as_retry_after(
) -> None:
    now = 1_000 * MS
    assert refusal_retry_after_s(now, now + 100 * MS, 350 * MS) == pytest.approx(0.25)
    assert refusal_retry_after_s(now, now - 5 * MS, 10 * MS) == pytest.approx(0.015)


def test_headroom_refuses_waits_close_to_the_deadline() -> None:
    now = 0
    assert refusal_retry_after_s(now, 100 * MS, 90 * MS, headroom=1.0) == 0.0
    assert refusal_retry_after_s(now, 100 * MS, 90 * MS, headroom=1.25) == pytest.approx(0.0125)
