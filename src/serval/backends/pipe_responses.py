"""A decoupled model's responses on a worker's pipe (backends/isolated_stream.py): one
response of one stream as a header, its tensors after it when it has outputs."""

from __future__ import annotations

from multiprocessing.connection import Connection

from serval.backends.base import ModelResponse
from serval.backends.pipe_tensors import recv_tensors, send_tensors
from serval.errors import BackendError, EngineRejectedInput

RESPONSE = "response"  # child -> parent: one response of one stream


# one response on the wire: (RESPONSE, stream id, final, status), tensors after a None status

def send_response(conn: Connection, stream_id: int, response: ModelResponse) -> None:
    error, outputs = response.error, response.outputs
    status: tuple[str, ...] | None
    if isinstance(error, EngineRejectedInput):
        status = ("rejected", error.message, error.detail)
    elif error is not None:
        status = ("failed", error.message)
    else:
        status = ("empty",) if outputs is None else None
    conn.send((RESPONSE, stream_id, response.final, status))
    if status is None and outputs is not None:
        send_tensors(conn, outputs)


def recv_response(conn: Connection, final: bool, status: tuple[str, ...] | None
                  ) -> ModelResponse:
    if status is None:
        return ModelResponse(outputs=recv_tensors(conn), final=final)
    if status[0] == "rejected":
        return ModelResponse(error=EngineRejectedInput(status[1], status[2]), final=final)
    if status[0] == "failed":
        return ModelResponse(error=BackendError(status[1]), final=final)
    return ModelResponse(final=final)
