"""A raw fuzzer of the REST API: hypothesis builds requests near and far from valid.

Shared by tests/integration/test_fuzz.py (a few hundred cases in CI) and bench/fuzz.py (10,000+).
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import struct
import zlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable

DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES", "FP8", "", "fp32"]
SETTINGS_PATHS = ("/v2/logging", "/v2/trace/setting", "/v2/models/{model}/trace/setting")
METHODS = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]
ODD_NAMES = ["..", "%2e%2e", "../../etc", "a" * 300, "ünï", "x y", "", "-", ".hidden", "0"]
ACTIONS = ["", "ready", "config", "stats", "infer", "load", "unload", "versions", "nope"]


@dataclass(frozen=True)
class FuzzRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    query: str = ""


@dataclass
class Tally:
    """What the server answered: statuses, 5xx with what caused them, broken connections."""

    statuses: Counter[int] = field(default_factory=Counter)
    server_errors: list[tuple[FuzzRequest, int, bytes]] = field(default_factory=list)
    broken: list[tuple[FuzzRequest, str]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.statuses.values()) + len(self.broken)

    def summary(self) -> str:
        counts = ", ".join(f"{status}: {n}" for status, n in sorted(self.statuses.items()))
        return (f"{self.total} requests ({counts}); 5xx: {len(self.server_errors)}; "
                f"broken connections: {len(self.broken)}")


def _json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(
        max_size=20)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(
        st.text(max_size=10), inner, max_size=5), max_leaves=30)


@st.composite
def _tensor(draw: st.DrawFn, names: list[str]) -> dict[str, Any]:
    shape = draw(st.lists(st.integers(-2, 40), min_size=0, max_size=4)) if draw(
        st.integers(0, 9)) else draw(st.sampled_from(HOSTILE_SHAPES))
    size = 1
    for dim in shape:
        size = min(size * max(dim, 0), 10_000)
    datatype = draw(st.sampled_from(DATATYPES))
    element = draw(st.sampled_from([st.floats(allow_nan=False, width=32), st.integers(-300, 300),
                                    st.booleans(), st.text(max_size=5)]))
    count = draw(st.sampled_from([size, size, max(size - 1, 0), size + 1]))
    data: Any = draw(st.lists(element, min_size=min(count, 200), max_size=min(count, 200)))
    if draw(st.integers(0, 9)) == 0:
        data = draw(_json_values())
    tensor: dict[str, Any] = {"name": draw(st.sampled_from(names)), "datatype": datatype,
                              "shape": shape, "data": data}
    if draw(st.booleans()):
        tensor["parameters"] = draw(st.dictionaries(
            st.sampled_from(["binary_data_size", "binary_data", "shared_memory_region", "x"]),
            _json_values(), max_size=2))
    if draw(st.integers(0, 9)) == 0:
        tensor.pop(draw(st.sampled_from(sorted(tensor))))
    return tensor


@st.composite
def infer_body(draw: st.DrawFn, input_names: list[str]) -> tuple[bytes, dict[str, str]]:
    """A v2 infer body: JSON near the schema, with optional binary tail and encodings."""
    doc: dict[str, Any] = {"inputs": draw(st.lists(_tensor(input_names), max_size=3))}
    if draw(st.booleans()):
        doc["outputs"] = draw(st.lists(st.fixed_dictionaries(
            {"name": st.sampled_from(["probabilities", "y", "OUTPUT0", "nope"])},
            optional={"parameters": st.dictionaries(st.sampled_from(["binary_data", "x"]),
                                                    _json_values(), max_size=2)}), max_size=3))
    if draw(st.booleans()):
        doc["parameters"] = draw(st.dictionaries(
            st.sampled_from(["timeout", "binary_data_output", "priority", "x"]),
            _json_values(), max_size=2))
    if draw(st.integers(0, 5)) == 0:
        doc["id"] = draw(_json_values())
    body = orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS) if _dumpable(doc) else b"{}"
    headers: dict[str, str] = {}
    if draw(st.integers(0, 3)) == 0:
        tail = draw(st.binary(max_size=256))
        headers["Inference-Header-Content-Length"] = str(draw(st.sampled_from(
            [len(body), len(body), 0, len(body) + 3, -1, len(body) + len(tail) + 10])))
        body += tail
    return body, headers


def _dumpable(doc: Any) -> bool:
    try:
        orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS)
    except orjson.JSONEncodeError:
        return False
    return True


# Shapes no tensor may have: too many dims, a dim past int64, spans that overflow, negatives.
HOSTILE_SHAPES = [[1] * 65, [1] * 200, [0, 2**63], [2**64 - 1], [0, 2**40, 2**40],
                  [2**31, 2**31, 2**31], [-(2**63)], [0, -1], [2**63 - 1, 0]]
HOSTILE_HEADER_VALUES = ["\xff\xfe", "1\x80", "inf", "nan", "1e308", "-inf", "1e400", "0x10",
                         " 12 ", "1_0", "+5", "\u00e9"]


@st.composite
def model_request(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    """A request aimed at a served model, well formed but for its values: token ids outside
    embed's vocabulary (16), hostile shapes, odd floats; JSON or binary tensors."""
    kind = draw(st.sampled_from(["embed", "embed", "linear", "shape"]))
    if kind == "embed":
        rows, width = draw(st.integers(1, 3)), draw(st.integers(1, 5))
        values = draw(st.lists(st.integers(-40, 40), min_size=rows * width,
                               max_size=rows * width))
        name, datatype, shape, model = "ids", "INT64", [rows, width], "embed"
        raw = b"".join(v.to_bytes(8, "little", signed=True) for v in values)
    elif kind == "linear":
        rows = draw(st.integers(1, 3))
        values = draw(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False),
                               min_size=rows * 8, max_size=rows * 8))
        name, datatype, shape, model = "x", "FP32", [rows, 8], "linear"
        raw = b"".join(struct.pack("<f", v) for v in values)
    else:
        shape = draw(st.sampled_from(HOSTILE_SHAPES))
        name, datatype, model = draw(st.sampled_from([("x", "FP32", "linear"),
                                                       ("ids", "INT64", "embed")]))
        values, raw = [], b""
    tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        tensor["data"] = values
        body = orjson.dumps({"inputs": [tensor]})
    else:
        tensor["parameters"] = {"binary_data_size": len(raw)}
        header = orjson.dumps({"inputs": [tensor]})
        headers["Inference-Header-Content-Length"] = str(len(header))
        body = header + raw
    return f"/v2/models/{model}/infer", body, headers


@st.composite
def fuzz_request(draw: st.DrawFn, models: list[str], input_names: list[str],
                 valid: list[FuzzRequest]) -> FuzzRequest:
    """Any request: real and odd routes, every method, valid-ish and garbage bodies."""
    if valid and draw(st.integers(0, 4)) == 0:
        return _encoded(draw, draw(st.sampled_from(valid)))
    if draw(st.integers(0, 4)) == 0:
        path, body, headers = draw(model_request())
        request = _encoded(draw, FuzzRequest("POST", path, headers, body))
        if draw(st.integers(0, 3)) == 0:
            header = draw(st.sampled_from(["Serval-Timeout-Ms", "Content-Encoding",
                                           "Inference-Header-Content-Length"]))
            request.headers[header] = draw(st.sampled_from(HOSTILE_HEADER_VALUES))
        return request
    model = draw(st.sampled_from(models + ODD_NAMES))
    version = draw(st.sampled_from(["", "", "/versions/1", "/versions/0", "/versions/x"]))
    action = draw(st.sampled_from(ACTIONS))
    infer_path = f"/v2/models/{model}{version}/infer"
    path = infer_path if draw(st.booleans()) else draw(st.sampled_from([
        f"/v2/models/{model}{version}/{action}".rstrip("/"),
        f"/v2/repository/models/{model}/{action}", "/v2/repository/index", "/v2",
        "/v2/health/live", "/v2/health/ready", "/v2/models/stats", "/metrics",
        "/v2/openapi.json", "/", "/v2/models", "/v2//models//", "/v2/models/%00",
        "/status", "/status/models", f"/status/models/{model}", "/status/nope",
    ]))
    if draw(st.integers(0, 9)) == 0:
        path = "/" + draw(st.text(st.characters(min_codepoint=33, max_codepoint=126,
                                                exclude_characters="?#"), max_size=40))
    method = draw(st.sampled_from(["POST"] * 6 + METHODS)) if path == infer_path else draw(
        st.sampled_from(["GET"] * 3 + METHODS))
    headers: dict[str, str] = {}
    kind = draw(st.sampled_from(["infer", "infer", "infer", "json", "bytes", "empty"]))
    if kind == "infer":
        body, headers = draw(infer_body(input_names))
    elif kind == "json":
        value = draw(_json_values())
        body = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS) if _dumpable(value) else b"["
    elif kind == "bytes":
        body = draw(st.binary(max_size=512))
    else:
        body = b""
    request = _encoded(draw, FuzzRequest(method, path, headers, body), broken=True)
    headers = request.headers
    if draw(st.integers(0, 5)) == 0:
        headers["Serval-Timeout-Ms"] = draw(st.sampled_from(["0", "-1", "abc", "1e9", "0.001",
                                                             "50", *HOSTILE_HEADER_VALUES]))
    if draw(st.integers(0, 9)) == 0:
        headers[draw(st.sampled_from(["Content-Encoding", "Inference-Header-Content-Length"]))] = \
            draw(st.sampled_from(HOSTILE_HEADER_VALUES))
    if draw(st.integers(0, 7)) == 0:
        headers["Authorization"] = draw(st.sampled_from(["Bearer", "Bearer x", "Basic a",
                                                         "Bearer " + "a" * 500]))
    query = ""
    if draw(st.integers(0, 3)) == 0:
        query = draw(st.sampled_from(QUERIES) | st.text(st.characters(
            min_codepoint=33, max_codepoint=0x2FF, exclude_characters="#"), max_size=30))
    return FuzzRequest(method, path, headers, request.body, query)


QUERIES = ["sort=name&order=desc", "page=-1", "page=99999999999999999999", "limit=0",
           "state=READY", "state=%FF%FE", "a=1&a=2", "%zz", "sort=", "=", "&&&", "page=1.5",
           "limit=1e9", "q=" + "x" * 3000, "order=\u00e9"]


def _encoded(draw: st.DrawFn, request: FuzzRequest, broken: bool = False) -> FuzzRequest:
    """The request with its body sent as is, gzip or deflate (or, if broken, mislabelled)."""
    choices = ["", "", "", "gzip", "deflate"] + (["br", "gzip-broken"] if broken else [])
    encoding = draw(st.sampled_from(choices))
    body, headers = request.body, dict(request.headers)
    if encoding == "gzip":
        body = gzip.compress(body)
    elif encoding == "deflate":
        body = zlib.compress(body)
    if encoding:
        headers["Content-Encoding"] = encoding.replace("-broken", "")
    return FuzzRequest(request.method, request.path, headers, body)


def send(connection: http.client.HTTPConnection, request: FuzzRequest) -> tuple[int, bytes]:
    url = quote(request.path, safe="/%")
    if request.query:
        url += "?" + quote(request.query, safe="=&%")
    connection.request(request.method, url, body=request.body, headers=request.headers)
    response = connection.getresponse()
    return response.status, response.read()


def run_fuzz(host: str, port: int, cases: int, models: list[str], input_names: list[str],
             valid: list[FuzzRequest], seed: int | None = None) -> Tally:
    """Send `cases` generated requests over one keep-alive connection (reopened as needed)."""
    tally = Tally()
    connection = http.client.HTTPConnection(host, port, timeout=30)

    @settings(max_examples=cases, deadline=None, database=None, derandomize=seed is not None,
              suppress_health_check=list(HealthCheck), phases=["generate"])
    @given(fuzz_request(models, input_names, valid))
    def one(request: FuzzRequest) -> None:
        nonlocal connection
        try:
            status, body = send(connection, request)
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            connection = http.client.HTTPConnection(host, port, timeout=30)
            tally.broken.append((request, repr(exc)))
            return
        tally.statuses[status] += 1
        if status >= 500:
            tally.server_errors.append((request, status, body[:300]))
        # the server may close after a malformed message; and it holds a connection that
        # sends again within a 429's Retry-After for a second before refusing it again
        # (every later case on it would then take a second)
        if status in (400, 413, 429):
            connection.close()
            connection = http.client.HTTPConnection(host, port, timeout=30)

    one()
    connection.close()
    return tally


@dataclass
class SchemaTally:
    """Schemathesis cases run per generation mode, and the checks that failed."""

    cases: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        counts = ", ".join(f"{status}: {n}" for status, n in sorted(self.statuses.items()))
        return (f"{sum(self.cases.values())} schemathesis cases ({dict(self.cases)}; {counts}); "
                f"failed checks: {len(self.failures)}")


def run_schemathesis(doc: dict[str, Any], base_url: str, cases_per_operation: int,
                     negative: bool = True) -> SchemaTally:
    """Every operation of the OpenAPI document, valid (and invalid) data, checked answers."""
    import schemathesis
    from schemathesis import GenerationMode
    from schemathesis.checks import (
        content_type_conformance,
        not_a_server_error,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_schema_conformance]
    tally = SchemaTally()
    modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if negative else [])
    schema = schemathesis.openapi.from_dict(doc)
    concrete = {path for path in doc["paths"] if "{" not in path}
    operations = [result.ok() for result in schema.get_all_operations()]
    # the settings routes last: a generated log setting may mute the error log that the
    # fuzz test reads for tracebacks, and must not do so before the other routes run
    operations.sort(key=lambda operation: operation.path in SETTINGS_PATHS)
    for operation in operations:
        for mode in modes:
            _run_operation(operation, mode, base_url, cases_per_operation, checks,
                           [not_a_server_error], tally, concrete)
    return tally


def _run_operation(operation: Any, mode: Any, base_url: str, cases: int, checks: list[Any],
                   aliased_checks: list[Any], tally: SchemaTally, concrete: set[str]) -> None:
    @settings(max_examples=cases, deadline=None, database=None, phases=["generate"],
              suppress_health_check=list(HealthCheck))
    @given(operation.as_strategy(generation_mode=mode))
    def one(case: Any) -> None:
        tally.cases[mode.value] += 1
        # OpenAPI matches a concrete path before a templated one: an invalid model name
        # "stats" makes GET /v2/models/{model} into GET /v2/models/stats, another route with
        # its own answer, so only "no 5xx" (aliased_checks) applies to it here
        aliased = case.formatted_path in concrete and case.formatted_path != operation.path
        try:
            response = case.call(base_url=base_url)
            tally.statuses[response.status_code] += 1
            case.validate_response(response, checks=aliased_checks if aliased else checks)
        except Exception as exc:  # a failed check: keep going, report them all
            tally.failures.append((f"{operation.label} [{mode.value}]", str(exc)[:400]))

    with contextlib.suppress(Unsatisfiable):  # nothing to make invalid (no body, no params)
        one()
