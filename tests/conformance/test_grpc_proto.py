"""Serval's .proto keeps Triton's field numbers and types, so stock gRPC clients work.

Both define `inference.*` symbols, which one protobuf pool cannot hold twice, so each side
is read in its own subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

_DUMP = """
import json, sys, importlib
module = importlib.import_module(sys.argv[1])
fields, methods = {}, {}
def walk(message):
    for field in message.fields:
        fields[field.full_name] = [field.number, field.type, field.label]
    for nested in message.nested_types:
        walk(nested)
for message in module.DESCRIPTOR.message_types_by_name.values():
    walk(message)
for service in module.DESCRIPTOR.services_by_name.values():
    for method in service.methods:
        methods[method.full_name] = [method.input_type.full_name, method.output_type.full_name]
print(json.dumps({"fields": fields, "methods": methods}))
"""


def _dump(module: str) -> dict[str, dict[str, list[object]]]:
    out = subprocess.run([sys.executable, "-c", _DUMP, module], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return dict(json.loads(out))


def test_every_serval_field_matches_triton() -> None:
    ours = _dump("serval.protocol.grpc.grpc_service_pb2")
    triton = _dump("tritonclient.grpc.service_pb2")
    triton_config = _dump("tritonclient.grpc.model_config_pb2")
    reference = {**triton["fields"], **triton_config["fields"]}
    mismatched = {name: (spec, reference.get(name)) for name, spec in ours["fields"].items()
                  if reference.get(name) != spec}
    assert not mismatched
    assert len(ours["fields"]) > 100


def test_every_serval_rpc_matches_triton() -> None:
    ours = _dump("serval.protocol.grpc.grpc_service_pb2")["methods"]
    triton = _dump("tritonclient.grpc.service_pb2")["methods"]
    assert "inference.GRPCInferenceService.ModelInfer" in ours
    assert {name: triton.get(name) for name in ours} == ours


_SCHEMA = """
import sys, importlib
from google.protobuf import descriptor_pb2
module = importlib.import_module(sys.argv[1])
proto = descriptor_pb2.FileDescriptorProto()
module.DESCRIPTOR.CopyToProto(proto)
print(proto.SerializeToString().hex())
"""


def test_the_vendored_model_config_schema_is_tritons() -> None:
    """Byte for byte, its file name included: one process may import both (protobuf's pool
    takes an identical file twice, and refuses two files defining one symbol)."""
    def schema(module: str) -> str:
        return subprocess.run([sys.executable, "-c", _SCHEMA, module], capture_output=True,
                              text=True, check=True, timeout=60).stdout

    ours = schema("serval.protocol.grpc.model_config_pb2")
    assert ours and ours == schema("tritonclient.grpc.model_config_pb2")
