"""A worker pipe's requests and results (backends/isolated.py): a batch as its requests, each
with its id, parameters and requested outputs, and the answer as a status per request."""

from __future__ import annotations

from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from serval.backends.pipe_tensors import (
    EncodedTensors,
    UnsendableTensor,
    encode_tensors,
    recv_tensors,
    send_tensors,
    write_tensors,
)
from serval.errors import BackendError, EngineRejectedInput, ServalError
from serval.protocol.types import InferRequest, RequestedOutput, TensorDict

REQUESTS = "requests"


# requests: a header of (id, parameters, requested outputs) each, then each one's tensors;
# the answer: a status per request (None: ok), then the tensors of each one that succeeded

def send_requests(conn: Connection, requests: Sequence[InferRequest]) -> None:
    heads = [(request.id, request.parameters,
              [output.name for output in request.outputs] if request.outputs else None)
             for request in requests]
    conn.send((REQUESTS, heads))
    for request in requests:
        send_tensors(conn, request.inputs)


def recv_requests(conn: Connection, heads: list[tuple[Any, ...]]) -> list[InferRequest]:
    requests = []
    for request_id, parameters, outputs in heads:
        requests.append(InferRequest(
            recv_tensors(conn), id=request_id, parameters=parameters,
            outputs=None if outputs is None else [RequestedOutput(name) for name in outputs]))
    return requests


def send_results(conn: Connection, results: Sequence[TensorDict | ServalError]) -> None:
    """A status per request, then the tensors of those that succeeded: each encoded first, so
    one whose outputs cannot be sent fails alone, the pipe left whole."""
    statuses: list[tuple[str, ...] | None] = []
    encoded: list[EncodedTensors] = []
    for result in results:
        if isinstance(result, EngineRejectedInput):
            statuses.append(("rejected", result.message, result.detail))
        elif isinstance(result, ServalError):
            statuses.append(("failed", result.message))
        else:
            try:
                encoded.append(encode_tensors(result))
            except UnsendableTensor as exc:
                statuses.append(("failed", f"an output of the model: {exc}"))
                continue
            statuses.append(None)
    conn.send(("ok", statuses))
    for tensors in encoded:
        write_tensors(conn, tensors)


def recv_results(conn: Connection, statuses: list[tuple[str, ...] | None]
                 ) -> list[TensorDict | ServalError]:
    results: list[TensorDict | ServalError] = []
    for status in statuses:
        if status is None:
            results.append(recv_tensors(conn))
        elif status[0] == "rejected":
            results.append(EngineRejectedInput(status[1], status[2]))
        else:
            results.append(BackendError(status[1]))
    return results
