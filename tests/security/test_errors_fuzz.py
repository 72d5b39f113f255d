"""The fuzz job in the default run: a few thousand seeded cases over REST, gRPC and HTTP/2
frames against a real server; no 5xx, no crash, no traceback in its log (bench/fuzz.py runs
the same fuzzers at 20,000+ cases)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import RunningServer
from tests.grpc_fuzz import run_grpc_fuzz
from tests.h2_fuzz import run_h2_fuzz
from tests.integration.test_fuzz import INPUT_NAMES, MODELS, fuzz_repository, valid_requests
from tests.rest_fuzz import run_fuzz

pytestmark = pytest.mark.integration
REST_CASES, GRPC_CASES, H2_CASES = 800, 2_000, 800


@pytest.fixture(scope="module")
def fuzzed(server_factory: Callable[..., RunningServer],
           tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    return server_factory(fuzz_repository(tmp_path_factory.mktemp("errors-fuzz")))


@pytest.mark.timeout(600)  # ~150 s here; the default 300 s was passed on a busy CI box
def test_rest_fuzzing_gets_no_5xx(fuzzed: RunningServer) -> None:
    tally = run_fuzz("127.0.0.1", fuzzed.port, REST_CASES, MODELS, INPUT_NAMES,
                     valid_requests(), seed=15)
    assert tally.total == REST_CASES
    assert not tally.server_errors, tally.server_errors[:3]
    assert not tally.broken, tally.broken[:3]
    assert tally.statuses[200] > 0 and tally.statuses[400] > 0
    assert fuzzed.process.poll() is None


def test_grpc_fuzzing_gets_no_internal_or_unknown(fuzzed: RunningServer) -> None:
    tally = run_grpc_fuzz(fuzzed.grpc_url, GRPC_CASES, MODELS, INPUT_NAMES, seed=15)
    assert tally.total == GRPC_CASES
    assert not tally.server_errors, tally.server_errors[:3]
    assert tally.statuses["OK"] > 0 and tally.statuses["INVALID_ARGUMENT"] > 0
    assert fuzzed.process.poll() is None


def test_http2_frame_fuzzing_never_breaks_the_server(fuzzed: RunningServer) -> None:
    tally = run_h2_fuzz("127.0.0.1", fuzzed.grpc_port, H2_CASES, MODELS, INPUT_NAMES, seed=15)
    assert tally.cases == H2_CASES
    assert not tally.server_errors, tally.server_errors[:3]
    assert tally.outcomes["ping-ack"] > 0 and tally.outcomes["goaway:PROTOCOL_ERROR"] > 0
    assert fuzzed.process.poll() is None


def test_the_fuzzed_server_logged_no_traceback(fuzzed: RunningServer) -> None:
    log = fuzzed.log()
    assert "Traceback" not in log, log[log.find("Traceback") - 300:][:2000]
    assert fuzzed.process.poll() is None
