"""Tensors over a worker process's pipe (multiprocessing Connection): a header of (name,
dtype, shape), then each numeric array's raw bytes received straight into numpy memory; BYTES
(object) arrays pickled."""

from __future__ import annotations

from multiprocessing.connection import Connection

import numpy as np

from serval.protocol.types import TensorDict


def send_tensors(conn: Connection, tensors: TensorDict) -> None:
    """Header first; numeric arrays as raw buffers, BYTES (object) arrays pickled."""
    arrays = {name: np.asarray(array) for name, array in tensors.items()}
    conn.send(("tensors", [(name, a.dtype.str, a.shape) for name, a in arrays.items()]))
    for array in arrays.values():
        if array.dtype.hasobject:
            conn.send(array)
        else:  # ravel copies only what is not C-contiguous already
            conn.send_bytes(np.ravel(array).view(np.uint8).data)


def recv_tensors(conn: Connection) -> TensorDict:
    """The arrays send_tensors wrote, received into freshly allocated numpy memory."""
    kind, header = conn.recv()
    if kind != "tensors":
        raise EOFError(f"expected tensors, got {kind!r}")
    return read_arrays(conn, header)


def read_arrays(conn: Connection, header: list[tuple[str, str, tuple[int, ...]]]
                ) -> TensorDict:
    """The arrays a header announced (the header already read)."""
    tensors: TensorDict = {}
    for name, dtype, shape in header:
        if np.dtype(dtype).hasobject:
            tensors[name] = conn.recv()
            continue
        array = np.empty(shape, dtype=dtype)
        if array.nbytes:
            conn.recv_bytes_into(array.reshape(-1).view(np.uint8))
        else:
            conn.recv_bytes()
        tensors[name] = array
    return tensors
