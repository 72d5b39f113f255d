"""A request's deadline: from the transport's timeout, the request's own
`parameters.timeout`, or the server's default; all on perf_counter_ns."""

from __future__ import annotations

from serval.errors import InvalidInput
from serval.protocol.types import InferRequest

MAX_TIMEOUT_MS = 365 * 24 * 3600 * 1000.0  # longer (up to inf) is the same as no hurry


def deadline_after(received_ns: int, timeout_ms: float | None) -> int | None:
    """The deadline (perf_counter_ns) of a timeout counted from received_ns; huge ones capped."""
    if timeout_ms is None:
        return None
    return received_ns + int(min(timeout_ms, MAX_TIMEOUT_MS) * 1_000_000)


def may_set_timeout(body: bytes, json_length: int | None, encoding: bytes) -> bool:
    """Whether a REST body might carry `parameters.timeout` (judged without decoding it)."""
    if encoding not in (b"", b"identity"):
        return True
    return b'"timeout"' in (body if json_length is None else body[:json_length])


def request_deadline(request: InferRequest, received_ns: int, deadline_ns: int | None,
                     default_timeout_ns: int) -> int | None:
    """The earliest deadline (perf_counter_ns) the client set: the transport's (gRPC deadline,
    Serval-Timeout-Ms) and the request's `parameters.timeout` (µs, as Triton; 0 = none); the
    server default only if it set neither."""
    candidates = [] if deadline_ns is None else [deadline_ns]
    timeout_us = request.parameters.get("timeout")
    if timeout_us is not None:
        if type(timeout_us) is not int or timeout_us < 0:
            raise InvalidInput("parameter 'timeout' must be a non-negative integer of "
                               "microseconds")
        if timeout_us:
            candidates.append(received_ns + timeout_us * 1000)
    elif deadline_ns is None and default_timeout_ns:
        candidates.append(received_ns + default_timeout_ns)
    return min(candidates, default=None)
