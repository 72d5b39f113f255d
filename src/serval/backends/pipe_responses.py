"""A decoupled model's responses on a worker's pipe (backends/isolated_stream.py): one
response of one stream as a header, its tensors after it when it has outputs."""

from __future__ import annotations

from multiprocessing.connection import Connection

from serval.backends.base import ModelResponse
from serval.backends.pipe_tensors import (
    UnsendableTensor,
    encode_tensors,
    recv_tensors,
    write_tensors,
)
from serval.errors import BackendError, EngineRejectedInput

RESPONSE = "response"  # child -> parent: one response of one stream


# one response on the wire: (RESPONSE, stream id, final, status), tensors after a None status

def send_response(conn: Connection, stream_id: int, response: ModelResponse) -> None:
    """Outputs that cannot be sent (encoded before anything is written) go as a failure."""
    error, outputs = response.error, response.outputs
    status: tuple[str, ...] | None
    encoded = None
    if error is None and outputs is not None:
        try:
            encoded = encode_tensors(outputs)
        except UnsendableTensor as exc:
            error = BackendError(f"an output of the model: {exc}")
    if isinstance(error, EngineRejectedInput):
        status = ("rejected", error.message, error.detail)
    elif error is not None:
        status = ("failed", error.message)
    else:
        status = ("empty",) if outputs is None else None
    conn.send((RESPONSE, stream_id, response.final, status))
    if status is None and encoded is not None:
        write_tensors(conn, encoded)


def recv_response(conn: Connection, final: bool, status: tuple[str, ...] | None
                  ) -> ModelResponse:
    if status is None:
        return ModelResponse(outputs=recv_tensors(conn), final=final)
    if status[0] == "rejected":
        return ModelResponse(error=EngineRejectedInput(status[1], status[2]), final=final)
    if status[0] == "failed":
        return ModelResponse(error=BackendError(status[1]), final=final)
    return ModelResponse(final=final)
