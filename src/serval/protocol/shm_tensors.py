"""Tensors in shared memory: the shm parameters of an input or requested output (REST and gRPC
alike), inputs read from their regions, outputs written into theirs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from serval.errors import InvalidInput
from serval.protocol.bytes_tensor import check_raw_size, encode_bytes_elements, tensor_from_raw
from serval.protocol.shared_memory import Caller, SharedMemoryRegistry, shown_value
from serval.protocol.types import InferRequest, InferResponse, SharedMemoryRef

REGION, BYTE_SIZE = "shared_memory_region", "shared_memory_byte_size"
OFFSET = "shared_memory_offset"
PARAMETERS = (REGION, BYTE_SIZE, OFFSET)
DISABLED = ("shared memory is off on this server (off by default when it listens beyond "
            "loopback, and with --workers > 1; --shared-memory turns it on); send the tensor's "
            "data in the request")
CUDA_UNSUPPORTED = ("CUDA shared memory is not supported on this server; use system shared "
                    "memory (register_system_shared_memory) or send tensors in the request")


def shared_memory_ref(params: Mapping[str, Any], what: str) -> SharedMemoryRef | None:
    """The tensor's place in shared memory from its parameters; None when it has none."""
    if REGION not in params and BYTE_SIZE not in params and OFFSET not in params:
        return None  # (spelled out: this runs for every tensor of every request)
    region, size, offset = params.get(REGION), params.get(BYTE_SIZE), params.get(OFFSET, 0)
    if region is None or size is None:
        raise InvalidInput(f"{what}: shared memory needs both '{REGION}' and '{BYTE_SIZE}' "
                           f"('{OFFSET}' is optional)")
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"{what}: '{REGION}' must be a region's name (a non-empty string)")
    for key, value in ((BYTE_SIZE, size), (OFFSET, offset)):
        if type(value) is not int or value < 0:
            raise InvalidInput(f"{what}: '{key}' must be a non-negative integer, got "
                               f"{shown_value(value)}")
    return SharedMemoryRef(region, size, offset)


def uses_shared_memory(request: InferRequest) -> bool:
    return bool(request.shared_memory_inputs) or any(
        output.shared_memory is not None for output in request.outputs or ())


def resolve_inputs(regions: SharedMemoryRegistry | None, request: InferRequest,
                   max_elements: int, caller: Caller | None = None) -> None:
    """Read every shm input into request.inputs (a copy of its window; BYTES parsed), each
    shape first held to `max_elements` elements (as a tensor in the request is); check every
    shm output's window before any work. Only regions the caller reaches are there."""
    if not uses_shared_memory(request):
        return
    if regions is None:
        raise InvalidInput(DISABLED)
    for name, item in request.shared_memory_inputs.items():
        ref = item.ref
        elements = math.prod(item.shape)
        if elements > max_elements:
            raise InvalidInput(f"input '{name}': shape {list(item.shape)} has {elements} "
                               f"elements; this server accepts at most {max_elements} per "
                               "tensor (--max-tensor-elements)")
        check_raw_size(item.datatype, item.shape, ref.byte_size, name, f"{BYTE_SIZE} is")
        data = regions.read(ref.region, ref.offset, ref.byte_size, f"input '{name}'", caller)
        request.inputs[name] = tensor_from_raw(data, 0, ref.byte_size, item.datatype,
                                               item.shape, name, f"{BYTE_SIZE} is")
    for output in request.outputs or ():
        if (window := output.shared_memory) is not None:
            regions.check(window.region, window.offset, window.byte_size,
                          f"output '{output.name}'", caller)


def write_outputs(regions: SharedMemoryRegistry | None, request: InferRequest,
                  response: InferResponse, caller: Caller | None = None) -> None:
    """Write each output asked for in shared memory into its region; the answer carries the
    output's parameters (region, bytes written, offset) instead of its data, as Triton's."""
    for output in request.outputs or ():
        ref = output.shared_memory
        if ref is None or output.name not in response.outputs:
            continue
        if regions is None:
            raise InvalidInput(DISABLED)
        data = _raw_view(response.outputs[output.name])
        regions.write(ref.region, ref.offset, ref.byte_size, data, f"output '{output.name}'",
                      caller)
        params: dict[str, Any] = {REGION: ref.region, BYTE_SIZE: data.nbytes}
        if ref.offset:
            params[OFFSET] = ref.offset
        response.shared_memory_outputs[output.name] = params


def _raw_view(array: np.ndarray) -> memoryview:
    """The tensor's wire bytes (row-major little-endian; BYTES length-prefixed), as a view of
    the array itself when it already is that (no copy before the one into the region)."""
    if array.dtype == object or array.dtype.kind in ("U", "S"):
        return memoryview(encode_bytes_elements(array))
    little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return memoryview(little.reshape(-1).view(np.uint8).data)
