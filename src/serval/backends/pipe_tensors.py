"""Tensors over a worker process's pipe (multiprocessing Connection): a header of (name,
dtype, shape), then each numeric array's raw bytes received straight into numpy memory; BYTES
(object) arrays pickled.

A message's tensors are encoded (`encode_tensors`) before any of its bytes are written: what
cannot be sent (an object array holding a function) fails there, with the pipe untouched, so
the sender can answer an error instead of leaving half a message that desynchronises the pipe.
"""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np

from serval.protocol.types import TensorDict


@dataclass(frozen=True, slots=True)
class EncodedTensors:
    """What send_tensors writes: the header, then a pickle (a buffer) or an array per
    tensor."""

    header: list[tuple[str, str, tuple[int, ...]]]
    payloads: list[Any]


class UnsendableTensor(ValueError):
    """A tensor that cannot cross the pipe (an object array holding what pickle refuses)."""


def encode_tensors(tensors: TensorDict) -> EncodedTensors:
    """Everything but the numeric arrays' bytes, ready to write; UnsendableTensor names what
    cannot be sent."""
    header: list[tuple[str, str, tuple[int, ...]]] = []
    payloads: list[Any] = []
    for name, value in tensors.items():
        try:
            array = np.asarray(value)
        except Exception as exc:  # a ragged list
            raise UnsendableTensor(f"tensor '{name}' is not an array: {exc}") from exc
        header.append((name, array.dtype.str, array.shape))
        if array.dtype.hasobject:
            try:
                payloads.append(ForkingPickler.dumps(array))  # a buffer: no copy
            except Exception as exc:
                raise UnsendableTensor(f"tensor '{name}' cannot be sent: its elements must be "
                                       f"bytes or str ({type(exc).__name__}: {exc})") from exc
        else:
            payloads.append(array)
    return EncodedTensors(header, payloads)


def write_tensors(conn: Connection, encoded: EncodedTensors) -> None:
    """Write what encode_tensors made (nothing here can fail but the pipe)."""
    conn.send(("tensors", encoded.header))
    for payload in encoded.payloads:
        if isinstance(payload, np.ndarray):  # ravel copies only what is not C-contiguous
            conn.send_bytes(np.ravel(payload).view(np.uint8).data)
        else:
            conn.send_bytes(payload)  # a pickle: recv() unpickles it


def send_tensors(conn: Connection, tensors: TensorDict) -> None:
    """Header first; numeric arrays as raw buffers, BYTES (object) arrays pickled."""
    write_tensors(conn, encode_tensors(tensors))


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
