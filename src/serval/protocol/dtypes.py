"""The v2 datatype table: names on the wire, numpy dtypes, ONNX type strings."""

from __future__ import annotations

import numpy as np

from serval.errors import InvalidInput

# v2 name -> numpy dtype (little-endian, as the binary extension requires).
_V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(np.object_),
}
_NUMPY_TO_V2: dict[np.dtype, str] = {dt: name for name, dt in _V2_TO_NUMPY.items()}

_ONNX_TO_V2: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}

V2_DATATYPES: tuple[str, ...] = tuple(_V2_TO_NUMPY)


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of a v2 datatype name; InvalidInput for an unknown name."""
    try:
        return _V2_TO_NUMPY[datatype]
    except KeyError:
        raise InvalidInput(
            f"unknown datatype '{datatype}', expected one of {', '.join(V2_DATATYPES)}"
        ) from None


def v2_datatype(dtype: np.dtype) -> str:
    """The v2 datatype name of a numpy dtype (str and bytes arrays are BYTES)."""
    found = _NUMPY_TO_V2.get(dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)
    if found is not None:
        return found
    if dtype.kind in ("U", "S", "O"):
        return "BYTES"
    raise ValueError(f"numpy dtype {dtype} has no v2 datatype")


def from_onnx_type(onnx_type: str) -> str:
    """The v2 datatype of an ONNX Runtime type string such as 'tensor(float)'."""
    try:
        return _ONNX_TO_V2[onnx_type]
    except KeyError:
        raise ValueError(f"ONNX type {onnx_type} is not supported by the v2 protocol") from None

