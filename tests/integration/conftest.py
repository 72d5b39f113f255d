"""The fixture repository every integration test serves: tiny real ONNX models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from onnx import TensorProto

from tests import fixture_models
from tests.conftest import RunningServer

TYPED_MODELS = {
    "id_bool": TensorProto.BOOL, "id_uint8": TensorProto.UINT8, "id_int8": TensorProto.INT8,
    "id_int16": TensorProto.INT16, "id_int32": TensorProto.INT32, "id_int64": TensorProto.INT64,
    "id_uint16": TensorProto.UINT16, "id_uint32": TensorProto.UINT32,
    "id_uint64": TensorProto.UINT64, "id_fp16": TensorProto.FLOAT16,
    "id_fp64": TensorProto.DOUBLE, "id_bytes": TensorProto.STRING,
}


def build_fixture_repository(root: Path) -> Path:
    fixture_models.add_sub(root)
    fixture_models.linear(root)
    fixture_models.heavy(root)
    fixture_models.slow(root)
    fixture_models.fixed_shape(root)
    fixture_models.first_row_only(root)
    fixture_models.corrupt(root)
    for name, elem_type in TYPED_MODELS.items():
        fixture_models.typed_identity(root, name, elem_type)
    return root


@pytest.fixture(scope="session")
def fixture_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fixture_repository(tmp_path_factory.mktemp("repository"))


@pytest.fixture(scope="session")
def server(
    server_factory: Callable[..., RunningServer], fixture_repository: Path
) -> RunningServer:
    # the repository holds a corrupt model on purpose: strict readiness would say 503
    return server_factory(fixture_repository, "--no-strict-readiness")
