"""The v2 datatype table against the type systems it names: numpy, ONNX, OpenVINO, Triton's gRPC
protos (contents fields and model-config data types), and config validation."""

from __future__ import annotations

import numpy as np
import onnx
import pydantic
import pytest
from tritonclient.grpc import model_config_pb2, service_pb2  # Triton's own (serval's twin clashes)

from serval.errors import InvalidInput
from serval.model_config import TensorConfig
from serval.protocol.dtypes import (
    DATATYPES,
    NUMERIC_DATATYPES,
    V2_DATATYPES,
    Datatype,
    from_onnx_type,
    from_openvino_type,
    lookup,
    numpy_dtype,
    v2_datatype,
)

pytestmark = pytest.mark.unit


def test_the_table_lists_every_v2_datatype_serval_carries_once() -> None:
    assert V2_DATATYPES == ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16",
                            "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES")
    assert V2_DATATYPES[:-1] == NUMERIC_DATATYPES


@pytest.mark.parametrize("row", DATATYPES, ids=lambda row: row.name)
def test_numpy_dtypes_are_little_endian_and_map_back(row: Datatype) -> None:
    dt = row
    assert lookup(dt.name) is dt
    assert numpy_dtype(dt.name) is dt.numpy
    assert dt.numpy.byteorder in ("<", "|", "=")
    assert v2_datatype(dt.numpy) == dt.name
    if dt.numpy.kind != "O":
        assert v2_datatype(dt.numpy.newbyteorder(">")) == dt.name


def test_str_and_bytes_arrays_are_bytes_and_others_have_no_name() -> None:
    assert v2_datatype(np.array(["a"]).dtype) == "BYTES"
    assert v2_datatype(np.array([b"a"]).dtype) == "BYTES"
    with pytest.raises(ValueError, match="complex64"):
        v2_datatype(np.dtype(np.complex64))


@pytest.mark.parametrize("row", DATATYPES, ids=lambda row: row.name)
def test_onnx_type_strings_are_the_ones_onnx_gives_the_numpy_dtype(row: Datatype) -> None:
    dt = row
    numpy = np.dtype(np.str_) if dt.name == "BYTES" else dt.numpy
    elem = onnx.helper.np_dtype_to_tensor_dtype(numpy)
    assert dt.onnx == f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"
    assert from_onnx_type(dt.onnx) == dt.name


def test_an_onnx_type_without_a_v2_name_is_refused() -> None:
    with pytest.raises(ValueError, match=r"tensor\(bfloat16\)"):
        from_onnx_type("tensor(bfloat16)")


@pytest.mark.parametrize("row", DATATYPES, ids=lambda row: row.name)
def test_openvino_names_are_openvinos_own(row: Datatype) -> None:
    ov = pytest.importorskip("openvino")
    dt = row
    element = ov.Type.string if dt.name == "BYTES" else ov.Type(dt.numpy)
    assert element.get_type_name() == dt.openvino
    assert from_openvino_type(dt.openvino) == dt.name


def test_openvino_bf16_has_no_v2_datatype() -> None:
    assert from_openvino_type("bf16") is None


@pytest.mark.parametrize("row", DATATYPES, ids=lambda row: row.name)
def test_grpc_names_exist_in_tritons_protos(row: Datatype) -> None:
    dt = row
    assert model_config_pb2.DataType.Value(dt.config)
    if dt.grpc_contents is not None:
        assert dt.grpc_contents in service_pb2.InferTensorContents.DESCRIPTOR.fields_by_name
        values = [True] if dt.name == "BOOL" else [b"x"] if dt.name == "BYTES" else [1]
        getattr(service_pb2.InferTensorContents(), dt.grpc_contents).extend(values)


def test_only_fp16_travels_raw_only() -> None:
    assert [dt.name for dt in DATATYPES if dt.grpc_contents is None] == ["FP16"]


def test_an_unknown_name_is_invalid_input_listing_the_known_ones() -> None:
    with pytest.raises(InvalidInput, match="unknown datatype 'FP8', expected one of BOOL, "):
        numpy_dtype("FP8")


def test_config_accepts_exactly_the_tables_names() -> None:
    for name in V2_DATATYPES:
        assert TensorConfig(name="x", datatype=name).datatype == name
    with pytest.raises(pydantic.ValidationError, match="'FP64' or 'BYTES'"):
        TensorConfig(name="x", datatype="BF16")
