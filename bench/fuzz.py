"""Fuzzing benchmark: ≥ 10,000 generated requests across the REST API, zero 5xx, zero crashes.

Serves two tiny real ONNX models (the test fixtures) and sends, in one run:
- `--raw` requests from the hypothesis fuzzer in tests/rest_fuzz.py (every method, real and odd
  routes, near-valid and garbage bodies, gzip/deflate, odd headers);
- schemathesis cases (valid and invalid data) for every operation of GET /v2/openapi.json, each
  answer checked against the description (status, content type, schema) and for 5xx.

    .venv/bin/python bench/fuzz.py [--raw 10000] [--schema-cases 60]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import fixture_models
from tests.integration.test_fuzz import INPUT_NAMES, MODELS, valid_requests
from tests.rest_fuzz import run_fuzz, run_schemathesis

from bench import servers

GOAL_REQUESTS = 10_000


def main() -> None:
    args = _parse_args()
    root = Path(tempfile.mkdtemp(prefix="serval-fuzz-"))
    fixture_models.linear(root)
    fixture_models.add_sub(root)
    port = servers.free_port()
    command = [*servers.serval_command(root, port, 1, 0), "--max-request-mb", "16"]
    with servers.running(command, port, "/v2/health/ready", root / "server.log"):
        started = time.perf_counter()
        raw = run_fuzz(servers.HOST, port, args.raw, MODELS, INPUT_NAMES, valid_requests())
        raw_s = time.perf_counter() - started
        doc = servers.get_json(port, "/v2/openapi.json")
        doc["servers"] = [{"url": f"http://{servers.HOST}:{port}"}]
        _aim_at_models(doc)
        started = time.perf_counter()
        schema = run_schemathesis(doc, f"http://{servers.HOST}:{port}", args.schema_cases)
        schema_s = time.perf_counter() - started
        alive = servers.get_json(port, "/v2") is not None
    _report(raw, raw_s, schema, schema_s, alive, root / "server.log")


def _aim_at_models(doc: dict[str, object]) -> None:
    paths = doc["paths"]
    assert isinstance(paths, dict)
    for item in paths.values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "model":
                    parameter["schema"] = {"type": "string",
                                           "enum": [*MODELS, "nope", "..", "a b"]}


def _report(raw: object, raw_s: float, schema: object, schema_s: float, alive: bool,
            log: Path) -> None:
    from tests.rest_fuzz import SchemaTally, Tally

    assert isinstance(raw, Tally) and isinstance(schema, SchemaTally)
    total = raw.total + sum(schema.cases.values())
    five_xx = len(raw.server_errors) + sum(n for s, n in schema.statuses.items() if s >= 500)
    crashes = 0 if alive else 1
    print(f"raw fuzzer:   {raw.summary()} in {raw_s:.0f} s")
    print(f"schemathesis: {schema.summary()} in {schema_s:.0f} s")
    for request, status, body in raw.server_errors[:5]:
        print(f"  5xx {status}: {request.method} {request.path} -> {body[:120]!r}")
    for request, error in raw.broken[:5]:
        print(f"  broken connection: {request.method} {request.path}: {error}")
    for where, failure in schema.failures[:5]:
        print(f"  check failed: {where}: {failure[:200]}")
    tracebacks = log.read_text(errors="replace").count("Traceback")
    print(f"total {total} requests; 5xx {five_xx}; broken connections {len(raw.broken)}; "
          f"failed schema checks {len(schema.failures)}; server crashed: {not alive}; "
          f"tracebacks in the log: {tracebacks}")
    ok = (total >= GOAL_REQUESTS and five_xx == 0 and crashes == 0 and not raw.broken
          and not schema.failures)
    print(f"{'PASS' if ok else 'MISS'}: goal ≥ {GOAL_REQUESTS:,} generated requests, zero 5xx, "
          "zero crashes")


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", type=int, default=10_000, help="raw fuzzer requests")
    parser.add_argument("--schema-cases", type=int, default=60,
                        help="schemathesis cases per operation and mode (valid, invalid)")
    return parser.parse_args()


if __name__ == "__main__":
    main()
