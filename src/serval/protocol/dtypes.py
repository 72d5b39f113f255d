"""The v2 datatype table, the one place datatypes are listed: each v2 name with its numpy dtype,
its names in ONNX, OpenVINO and Triton's model config, and its typed gRPC contents field."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from serval.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class Datatype:
    """One v2 datatype and what it is called elsewhere (item size: `numpy.itemsize`)."""

    name: str  # on the wire (REST and gRPC)
    numpy: np.dtype  # little-endian, as the binary extension requires; object for BYTES
    onnx: str  # ONNX Runtime type string
    openvino: str  # OpenVINO element type name
    config: str  # data_type in Triton's model configuration
    grpc_contents: str | None  # InferTensorContents field; None: travels raw only


# BF16 is left out: numpy has no bfloat16, so Serval cannot carry it.
DATATYPES: tuple[Datatype, ...] = (
    Datatype("BOOL", np.dtype(np.bool_), "tensor(bool)", "boolean", "TYPE_BOOL",
             "bool_contents"),
    Datatype("UINT8", np.dtype("<u1"), "tensor(uint8)", "u8", "TYPE_UINT8", "uint_contents"),
    Datatype("UINT16", np.dtype("<u2"), "tensor(uint16)", "u16", "TYPE_UINT16", "uint_contents"),
    Datatype("UINT32", np.dtype("<u4"), "tensor(uint32)", "u32", "TYPE_UINT32", "uint_contents"),
    Datatype("UINT64", np.dtype("<u8"), "tensor(uint64)", "u64", "TYPE_UINT64",
             "uint64_contents"),
    Datatype("INT8", np.dtype("<i1"), "tensor(int8)", "i8", "TYPE_INT8", "int_contents"),
    Datatype("INT16", np.dtype("<i2"), "tensor(int16)", "i16", "TYPE_INT16", "int_contents"),
    Datatype("INT32", np.dtype("<i4"), "tensor(int32)", "i32", "TYPE_INT32", "int_contents"),
    Datatype("INT64", np.dtype("<i8"), "tensor(int64)", "i64", "TYPE_INT64", "int64_contents"),
    Datatype("FP16", np.dtype("<f2"), "tensor(float16)", "f16", "TYPE_FP16", None),
    Datatype("FP32", np.dtype("<f4"), "tensor(float)", "f32", "TYPE_FP32", "fp32_contents"),
    Datatype("FP64", np.dtype("<f8"), "tensor(double)", "f64", "TYPE_FP64", "fp64_contents"),
    Datatype("BYTES", np.dtype(np.object_), "tensor(string)", "string", "TYPE_STRING",
             "bytes_contents"),
)
_BY_NAME: dict[str, Datatype] = {dt.name: dt for dt in DATATYPES}
_BY_NUMPY: dict[np.dtype, str] = {dt.numpy: dt.name for dt in DATATYPES}
_BY_ONNX: dict[str, str] = {dt.onnx: dt.name for dt in DATATYPES}
_BY_OPENVINO: dict[str, str] = {dt.openvino: dt.name for dt in DATATYPES}
_BY_CONFIG: dict[str, str] = {dt.config: dt.name for dt in DATATYPES}
CONFIG_DATATYPES: tuple[str, ...] = tuple(_BY_CONFIG)  # Triton's TYPE_* names Serval serves

V2_DATATYPES: tuple[str, ...] = tuple(_BY_NAME)
# The numeric datatypes (and BOOL): the ones a load generator or sampler can fill at random.
NUMERIC_DATATYPES: tuple[str, ...] = tuple(dt.name for dt in DATATYPES if dt.numpy.kind in "biuf")

if TYPE_CHECKING:
    DatatypeName = str
else:  # a Literal of the table's names, so pydantic validates (and documents) them
    DatatypeName = Literal[V2_DATATYPES]


def lookup(name: str) -> Datatype:
    """The table's row for a v2 datatype name; InvalidInput for an unknown name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise InvalidInput(
            f"unknown datatype '{name}', expected one of {', '.join(V2_DATATYPES)}"
        ) from None


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a v2 datatype name; InvalidInput for an unknown name."""
    return lookup(name).numpy


def v2_datatype(dtype: np.dtype) -> str:
    """The v2 datatype name of a numpy dtype (str and bytes arrays are BYTES)."""
    found = _BY_NUMPY.get(dtype.newbyteorder("<") if dtype.byteorder == ">" else dtype)
    if found is not None:
        return found
    if dtype.kind in ("U", "S", "O"):
        return "BYTES"
    raise ValueError(f"numpy dtype {dtype} has no v2 datatype")


def from_onnx_type(onnx_type: str) -> str:
    """The v2 datatype of an ONNX Runtime type string such as 'tensor(float)'."""
    try:
        return _BY_ONNX[onnx_type]
    except KeyError:
        raise ValueError(f"ONNX type {onnx_type} is not supported by the v2 protocol") from None


def from_config_type(config_name: str) -> str | None:
    """The v2 datatype of a data_type in Triton's model configuration ('TYPE_FP32' -> 'FP32');
    None for one Serval does not serve."""
    return _BY_CONFIG.get(config_name)


def from_openvino_type(type_name: str) -> str | None:
    """The v2 datatype of an OpenVINO element type name such as 'f32'; None if it has none."""
    return _BY_OPENVINO.get(type_name)
