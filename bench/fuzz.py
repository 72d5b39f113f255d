"""Fuzzing benchmark: ≥ 20,000 generated cases over REST, gRPC and HTTP/2 frames, zero 5xx.

Serves three tiny real ONNX models (the test fixtures: linear, add_sub, and embed, whose Gather
fails on token ids outside its vocabulary) and sends, in one run:
- `--raw` requests from the hypothesis fuzzer in tests/rest_fuzz.py (every method, real and odd
  routes, near-valid and garbage bodies, gzip/deflate, odd headers);
- schemathesis cases (valid and invalid data) for every operation of GET /v2/openapi.json, each
  answer checked against the description (status, content type, schema) and for 5xx;
- `--grpc` calls from tests/grpc_fuzz.py (random, near-valid and byte-mutated messages for
  every RPC: huge and negative shapes, raw_input_contents mismatches, every parameter type);
- `--h2` connections from tests/h2_fuzz.py (random frames after a valid preface).

Exits non-zero on any 5xx (gRPC INTERNAL/UNKNOWN/DATA_LOSS/UNAVAILABLE, GOAWAY or RST_STREAM
INTERNAL_ERROR), a broken connection, a crash or a traceback in the server log.

    .venv/bin/python bench/fuzz.py [--raw 10000] [--grpc 6000] [--h2 4000] [--schema-cases 60]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import fixture_models
from tests.grpc_fuzz import GrpcTally, run_grpc_fuzz
from tests.h2_fuzz import H2Tally, run_h2_fuzz
from tests.integration.test_fuzz import INPUT_NAMES, MODELS, valid_requests
from tests.rest_fuzz import SchemaTally, Tally, run_fuzz, run_schemathesis

from bench import servers

GOAL_CASES = 20_000


def main() -> None:
    args = _parse_args()
    root = Path(tempfile.mkdtemp(prefix="serval-fuzz-"))
    fixture_models.linear(root)
    fixture_models.add_sub(root)
    fixture_models.embedding(root)
    port, grpc_port = servers.free_ports(2)
    command = [*servers.serval_command(root, port, 1, grpc_port), "--max-request-mb", "16"]
    log = root / "server.log"
    with servers.running(command, port, "/v2/health/ready", log):
        started = time.perf_counter()
        raw = run_fuzz(servers.HOST, port, args.raw, MODELS, INPUT_NAMES, valid_requests(),
                       seed=args.seed)
        raw_s = time.perf_counter() - started
        doc = servers.get_json(port, "/v2/openapi.json")
        doc["servers"] = [{"url": f"http://{servers.HOST}:{port}"}]
        _aim_at_models(doc)
        started = time.perf_counter()
        schema = run_schemathesis(doc, f"http://{servers.HOST}:{port}", args.schema_cases)
        schema_s = time.perf_counter() - started
        started = time.perf_counter()
        grpc_tally = run_grpc_fuzz(f"{servers.HOST}:{grpc_port}", args.grpc, MODELS,
                                   INPUT_NAMES, seed=args.seed)
        grpc_s = time.perf_counter() - started
        started = time.perf_counter()
        h2_tally = run_h2_fuzz(servers.HOST, grpc_port, args.h2, MODELS, INPUT_NAMES,
                               seed=args.seed)
        h2_s = time.perf_counter() - started
        alive = servers.get_json(port, "/v2") is not None
    ok = _report(raw, raw_s, schema, schema_s, grpc_tally, grpc_s, h2_tally, h2_s, alive, log)
    sys.exit(0 if ok else 1)


def _aim_at_models(doc: dict[str, object]) -> None:
    paths = doc["paths"]
    assert isinstance(paths, dict)
    for item in paths.values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter["name"] == "model":
                    parameter["schema"] = {"type": "string",
                                           "enum": [*MODELS, "nope", "..", "a b"]}


def _report(raw: Tally, raw_s: float, schema: SchemaTally, schema_s: float,
            grpc_tally: GrpcTally, grpc_s: float, h2_tally: H2Tally, h2_s: float, alive: bool,
            log: Path) -> bool:
    schema_cases = sum(schema.cases.values())
    total = raw.total + schema_cases + grpc_tally.total + h2_tally.cases
    schema_5xx = sum(n for s, n in schema.statuses.items() if s >= 500)
    five_xx = (len(raw.server_errors) + schema_5xx + len(grpc_tally.server_errors)
               + len(h2_tally.server_errors))
    print(f"REST raw fuzzer:  {raw.summary()} in {raw_s:.0f} s")
    print(f"REST schemathesis: {schema.summary()} in {schema_s:.0f} s")
    print(f"gRPC fuzzer:      {grpc_tally.summary()} in {grpc_s:.0f} s")
    print(f"HTTP/2 frames:    {h2_tally.summary()} in {h2_s:.0f} s")
    for request, status, body in raw.server_errors[:5]:
        print(f"  REST 5xx {status}: {request.method} {request.path} -> {body[:120]!r}")
    for request, error in raw.broken[:5]:
        print(f"  broken connection: {request.method} {request.path}: {error}")
    for where, failure in schema.failures[:5]:
        print(f"  check failed: {where}: {failure[:200]}")
    for method, code, details in grpc_tally.server_errors[:5]:
        print(f"  gRPC {code}: {method}: {details[:160]}")
    kinds = Counter(re.sub(r"\(request id \w+", "(request id …", outcome)
                    for _, outcome in h2_tally.server_errors)
    for outcome, count in kinds.most_common():
        print(f"  HTTP/2 fault x{count}: {outcome}")
    tracebacks = log.read_text(errors="replace").count("Traceback")
    print(f"total {total} cases (REST {raw.total + schema_cases}, gRPC {grpc_tally.total}, "
          f"HTTP/2 {h2_tally.cases}); 5xx {five_xx}; broken connections {len(raw.broken)}; "
          f"failed schema checks {len(schema.failures)}; server crashed: {not alive}; "
          f"tracebacks in the log: {tracebacks}")
    ok = (total >= GOAL_CASES and five_xx == 0 and alive and not raw.broken
          and not schema.failures and tracebacks == 0)
    print(f"{'PASS' if ok else 'MISS'}: goal ≥ {GOAL_CASES:,} generated cases, zero 5xx, "
          "zero crashes, no traceback")
    return ok


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", type=int, default=10_000, help="raw fuzzer requests")
    parser.add_argument("--schema-cases", type=int, default=60,
                        help="schemathesis cases per operation and mode (valid, invalid)")
    parser.add_argument("--grpc", type=int, default=6_000, help="gRPC fuzzer calls")
    parser.add_argument("--h2", type=int, default=4_000, help="HTTP/2 frame fuzzer connections")
    parser.add_argument("--seed", type=int, default=0, help="the fuzzers' seed")
    return parser.parse_args()


if __name__ == "__main__":
    main()
