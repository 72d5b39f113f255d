"""Serval's protobuf modules live in their own descriptor pool, so one process can import them
and tritonclient's (the same `inference.*` symbols) in either order, and the bytes agree."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_BOTH = """
import importlib, sys
first, second = sys.argv[1:3]
a, b = importlib.import_module(first), importlib.import_module(second)
ours = importlib.import_module("serval.protocol.grpc.grpc_service_pb2")
theirs = importlib.import_module("tritonclient.grpc.service_pb2")
sent = ours.ModelInferRequest(model_name="m", id="7").SerializeToString()
got = theirs.ModelInferRequest.FromString(sent)
print(got.model_name, got.id)
"""


@pytest.mark.parametrize("order", [
    ("serval.protocol.grpc.grpc_service_pb2", "tritonclient.grpc"),
    ("tritonclient.grpc", "serval.protocol.grpc.grpc_service_pb2"),
])
def test_serval_and_tritonclient_protos_load_in_one_process(order: tuple[str, str]) -> None:
    pytest.importorskip("tritonclient.grpc")
    done = subprocess.run([sys.executable, "-c", _BOTH, *order], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.split() == ["m", "7"]
