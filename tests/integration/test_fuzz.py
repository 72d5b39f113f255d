"""Fuzzing the live REST API: schemathesis from /v2/openapi.json, and a raw hypothesis fuzzer.

Every generated request must get a non-5xx answer that matches the description; bench/fuzz.py
runs the same at 10,000+ requests.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call
from tests.rest_fuzz import FuzzRequest, run_fuzz, run_schemathesis

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODELS = ["linear", "add_sub", "embed"]
INPUT_NAMES = ["x", "INPUT0", "INPUT1", "ids", "nope"]
CASES_PER_OPERATION = 15  # per operation and mode (valid, invalid); small ones exhaust sooner


@pytest.fixture(scope="module")
def fuzz_server(server_factory: Callable[..., RunningServer],
                tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    return server_factory(fuzz_repository(tmp_path_factory.mktemp("fuzz")))


def fuzz_repository(root: Path) -> Path:
    """The MODELS the fuzzers aim at, built in root."""
    fixture_models.linear(root)
    fixture_models.add_sub(root)
    fixture_models.embedding(root)
    return root


def valid_requests() -> list[FuzzRequest]:
    """Requests the fixture models answer 200, for the fuzzer to mix in (and encode)."""
    linear = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 8],
                                       "data": [0.5] * 16}]})
    pair = [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}
            for n in ("INPUT0", "INPUT1")]
    add_sub = orjson.dumps({"inputs": pair, "outputs": [{"name": "OUTPUT1"}]})
    return [FuzzRequest("POST", "/v2/models/linear/infer", {}, linear),
            FuzzRequest("POST", "/v2/models/add_sub/versions/1/infer", {}, add_sub),
            FuzzRequest("GET", "/v2/models/linear", {}, b""),
            FuzzRequest("GET", "/v2/models/add_sub/stats", {}, b"")]


def described(server: RunningServer) -> dict[str, Any]:
    """The server's own description, aimed at it, with model names it serves among the choices."""
    doc = copy.deepcopy(call(server.url, "GET", "/v2/openapi.json").json())
    doc["servers"] = [{"url": server.base}]
    for operation in (op for item in doc["paths"].values() for op in item.values()):
        for parameter in operation.get("parameters", []):
            if parameter["name"] == "model":
                parameter["schema"] = {"type": "string", "enum": [*MODELS, "nope", "..", "a b"]}
    return doc


def test_schemathesis_finds_no_5xx_and_no_undescribed_answer(
        fuzz_server: RunningServer) -> None:
    tally = run_schemathesis(described(fuzz_server), fuzz_server.base, CASES_PER_OPERATION)
    assert sum(tally.cases.values()) >= 250, tally.summary()
    assert not tally.failures, tally.failures[:3]
    assert tally.statuses[200] > 0 and tally.statuses[400] > 0
    assert fuzz_server.process.poll() is None


def test_the_description_covers_the_real_routes(fuzz_server: RunningServer) -> None:
    doc = call(fuzz_server.url, "GET", "/v2/openapi.json").json()
    assert doc["openapi"].startswith("3.") and len(doc["paths"]) == 26
    for template, operations in doc["paths"].items():
        path = template.replace("{model}", "linear").replace("{version}", "1")
        for method in operations:
            status = call(fuzz_server.url, method.upper(), path).status
            assert status not in (404, 405), (method, path, status)
            assert str(status) in operations[method]["responses"], (method, path, status)


def test_a_raw_fuzzer_gets_no_5xx_and_never_breaks_a_connection(
        fuzz_server: RunningServer) -> None:
    host, port = fuzz_server.url.split(":")
    tally = run_fuzz(host, int(port), 300, MODELS, INPUT_NAMES, valid_requests(), seed=0)
    assert tally.total == 300
    assert not tally.server_errors, tally.server_errors[:3]
    assert not tally.broken, tally.broken[:3]
    assert tally.statuses[200] > 0 and tally.statuses[400] > 0  # both sides of valid explored
    assert fuzz_server.process.poll() is None
