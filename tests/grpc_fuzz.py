"""A gRPC fuzzer: random, near-valid and byte-mutated v2 messages for every RPC, sent raw.

Seeded (`random.Random`), so a failing case replays. Shared by tests/integration/test_fuzz.py
(a few thousand cases in the default run) and bench/fuzz.py (the long run).
"""

from __future__ import annotations

import random
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb  # serval's own twin clashes in one process

SERVICE = "/inference.GRPCInferenceService/"
DATATYPES = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES", "BF16", "", "fp32", "FP8"]
CONTENTS_FIELDS = ["bool_contents", "int_contents", "int64_contents", "uint_contents",
                   "uint64_contents", "fp32_contents", "fp64_contents", "bytes_contents"]
# What a server must never answer to a client's bytes (the gRPC 5xx); UNAVAILABLE included:
# every fuzzed model is loaded, so it would mean the server broke.
SERVER_FAULTS = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS,
                 grpc.StatusCode.UNAVAILABLE}
ODD_NAMES = ["", "..", "../../etc/passwd", "a" * 300, "ünï", "x\x00y", "a/b", "nope", "-"]
_INT64 = 2**63


@dataclass
class GrpcTally:
    """Status codes by name, and the server faults with what caused them."""

    statuses: Counter[str] = field(default_factory=Counter)
    server_errors: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.statuses.values())

    def summary(self) -> str:
        counts = ", ".join(f"{code}: {n}" for code, n in sorted(self.statuses.items()))
        return f"{self.total} calls ({counts}); server faults: {len(self.server_errors)}"


def _shape(rng: random.Random) -> list[int]:
    roll = rng.random()
    if roll < 0.05:
        return [1] * rng.choice([65, 100, 200])  # more dims than any tensor may have
    if roll < 0.10:
        return [rng.choice([0, 1, 2]), rng.choice([2**62, _INT64 - 1, 2**40])] + [2**40] * \
            rng.randint(0, 3)
    if roll < 0.15:
        return [rng.randint(-_INT64, -1) if rng.random() < 0.5 else -1, 8]
    if roll < 0.5:
        return [rng.randint(1, 4), 8]
    return [rng.randint(-1, 20) for _ in range(rng.randint(0, 4))]


def _values(rng: random.Random, field_name: str, count: int) -> list[Any]:
    count = min(count, 64)
    if field_name == "bool_contents":
        return [rng.random() < 0.5 for _ in range(count)]
    if field_name == "int_contents":
        return [rng.randint(-2**31, 2**31 - 1) for _ in range(count)]
    if field_name == "int64_contents":
        return [rng.randint(-_INT64, _INT64 - 1) for _ in range(count)]
    if field_name == "uint_contents":
        return [rng.randint(0, 2**32 - 1) for _ in range(count)]
    if field_name == "uint64_contents":
        return [rng.randint(0, 2**64 - 1) for _ in range(count)]
    if field_name == "bytes_contents":
        return [rng.randbytes(rng.randint(0, 8)) for _ in range(count)]
    specials = [float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 3.4e38]
    return [rng.choice(specials) if rng.random() < 0.1 else rng.uniform(-5, 5)
            for _ in range(count)]


def _parameter(rng: random.Random, target: Any) -> None:
    kind = rng.randrange(6)
    if kind == 0:
        target.bool_param = rng.random() < 0.5
    elif kind == 1:
        target.int64_param = rng.choice([0, 1, -1, 1000, _INT64 - 1, -_INT64])
    elif kind == 2:
        target.string_param = rng.choice(["", "x", "1000", "ünï", "\x00", "a" * 200])
    elif kind == 3:
        target.double_param = rng.choice([0.0, 1.5, -1.0, float("nan"), float("inf"), 1e308])
    elif kind == 4:
        target.uint64_param = rng.choice([0, 1, 2**64 - 1, 2**63])
    # kind 5: no choice set


def _parameters(rng: random.Random, params: Any) -> None:
    for _ in range(rng.choice([0, 0, 1, 2])):
        key = rng.choice(["timeout", "binary_data_output", "priority", "sequence_id",
                          "binary_data", "binary_data_size", "x", ""])
        _parameter(rng, params[key])


def infer_message(rng: random.Random, models: list[str], input_names: list[str],
                  width: int = 8) -> pb.ModelInferRequest:
    """A ModelInferRequest near the schema: odd shapes, datatypes, contents, raw, parameters."""
    message = pb.ModelInferRequest(
        model_name=rng.choice(models * 4 + ODD_NAMES),
        model_version=rng.choice(["", "", "", "1", "0", "x", "99"]),
        id=rng.choice(["", "", "r1", "ü" * 3]),
    )
    _parameters(rng, message.parameters)
    raw_mode = rng.random() < 0.5
    for _ in range(rng.choice([0, 1, 1, 1, 2, 3])):
        tensor = message.inputs.add(name=rng.choice([*input_names, ""]),
                                    datatype=rng.choice(["FP32"] * 8 + DATATYPES))
        tensor.shape.extend(_shape(rng))
        _parameters(rng, tensor.parameters)
        count = 1
        for dim in tensor.shape:
            count *= max(dim, 0)
        count = rng.choice([count, count, max(count - 1, 0), count + 1])
        if raw_mode:
            itemsize = rng.choice([4, 4, 4, 1, 2, 8])
            size = min(count * itemsize, 4096)
            message.raw_input_contents.append(rng.randbytes(rng.choice([size, size, 3, 0])))
        else:
            contents_field = rng.choice(
                [CONTENTS_FIELDS[5]] * 4 + CONTENTS_FIELDS)
            getattr(tensor.contents, contents_field).extend(_values(rng, contents_field, count))
    if raw_mode and rng.random() < 0.15:  # raw entries that do not match the inputs
        if rng.random() < 0.5 and message.raw_input_contents:
            del message.raw_input_contents[-1]
        else:
            message.raw_input_contents.append(rng.randbytes(rng.randint(0, 16)))
    for _ in range(rng.choice([0, 0, 1, 2])):
        output = message.outputs.add(name=rng.choice(["probabilities", "OUTPUT0", "nope", ""]))
        _parameters(rng, output.parameters)
    return message


def model_message(rng: random.Random) -> pb.ModelInferRequest:
    """Well formed but for its values: embed's token ids mostly outside its vocabulary (16),
    typed or raw; or linear with a hostile shape."""
    if rng.random() < 0.7:
        rows, width = rng.randint(1, 3), rng.randint(1, 5)
        ids = [rng.randint(-40, 40) for _ in range(rows * width)]
        message = pb.ModelInferRequest(model_name="embed")
        tensor = message.inputs.add(name="ids", datatype="INT64", shape=[rows, width])
        if rng.random() < 0.5:
            tensor.contents.int64_contents.extend(ids)
        else:
            message.raw_input_contents.append(
                b"".join(v.to_bytes(8, "little", signed=True) for v in ids))
        return message
    message = pb.ModelInferRequest(model_name="linear")
    shape = rng.choice([[1] * 65, [1] * 300, [0, _INT64 - 1], [0, 2**40, 2**40], [-1, 8],
                        [-_INT64], [2**31, 2**31, 2**31], [1, 8]])
    message.inputs.add(name="x", datatype="FP32", shape=shape)
    message.raw_input_contents.append(b"\0" * rng.choice([0, 4, 32]))
    return message


def valid_linear(rows: int = 2, width: int = 8) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="linear")
    tensor = message.inputs.add(name="x", datatype="FP32", shape=[rows, width])
    tensor.contents.fp32_contents.extend([0.25] * rows * width)
    return message


def mutate(rng: random.Random, data: bytes) -> bytes:
    """Flip, insert, delete, truncate or splice bytes of a serialized message."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        roll = rng.randrange(6)
        position = rng.randrange(len(out) + 1)
        if roll == 0 and out:
            out[min(position, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif roll == 1:
            out[position:position] = rng.randbytes(rng.randint(1, 8))
        elif roll == 2:
            del out[position:position + rng.randint(1, 8)]
        elif roll == 3:
            del out[position:]
        elif roll == 4 and out:  # a varint that claims far more bytes than follow
            out[position:position] = bytes([0x0A, 0xFF, 0xFF, 0xFF, 0x7F])
        else:
            out[min(position, len(out)):min(position, len(out))] = struct.pack(
                "<Q", rng.getrandbits(64))
    return bytes(out)


def fuzz_case(rng: random.Random, models: list[str], input_names: list[str]
              ) -> tuple[str, bytes, bool]:
    """(method, request bytes, streaming) for one call."""
    roll = rng.random()
    if roll < 0.15:
        method = "ModelStreamInfer" if rng.random() < 0.15 else "ModelInfer"
        return method, model_message(rng).SerializeToString(), False
    if roll < 0.55:
        message = infer_message(rng, models, input_names)
        data = message.SerializeToString()
        return ("ModelStreamInfer" if rng.random() < 0.15 else "ModelInfer"), data, False
    if roll < 0.75:
        base = valid_linear(rng.randint(1, 3)) if rng.random() < 0.5 else infer_message(
            rng, models, input_names)
        return "ModelInfer", mutate(rng, base.SerializeToString()), False
    if roll < 0.80:
        return "ModelInfer", rng.randbytes(rng.randint(0, 200)), False
    name = rng.choice(models * 3 + ODD_NAMES)
    version = rng.choice(["", "1", "x", "-1", "99"])
    method, message = rng.choice([
        ("ModelMetadata", pb.ModelMetadataRequest(name=name, version=version)),
        ("ModelConfig", pb.ModelConfigRequest(name=name, version=version)),
        ("ModelReady", pb.ModelReadyRequest(name=name, version=version)),
        ("ModelStatistics", pb.ModelStatisticsRequest(name=name, version=version)),
        ("ServerMetadata", pb.ServerMetadataRequest()),
        ("RepositoryIndex", pb.RepositoryIndexRequest(ready=rng.random() < 0.5)),
        ("ServerLive", pb.ServerLiveRequest()),
        ("Nope", pb.ServerLiveRequest()),
    ])
    data = message.SerializeToString()
    if rng.random() < 0.3:
        data = mutate(rng, data)
    return method, data, False


def _identity(data: bytes) -> bytes:
    return data


def run_grpc_fuzz(target: str, cases: int, models: list[str], input_names: list[str],
                  seed: int = 0, timeout_s: float = 10.0) -> GrpcTally:
    """Send `cases` calls on one channel; count status codes, keep the server faults."""
    rng = random.Random(seed)
    tally = GrpcTally()
    options = [("grpc.max_send_message_length", 64 * 1024 * 1024),
               ("grpc.max_receive_message_length", 64 * 1024 * 1024)]
    with grpc.insecure_channel(target, options=options) as channel:
        callers: dict[str, Callable[..., Any]] = {}
        for _ in range(cases):
            method, data, _ = fuzz_case(rng, models, input_names)
            streaming = method == "ModelStreamInfer"
            if method not in callers:
                path = SERVICE + method
                callers[method] = (channel.stream_stream if streaming else channel.unary_unary)(
                    path, request_serializer=_identity, response_deserializer=_identity)
            code, details = _call(callers[method], data, streaming, timeout_s)
            tally.statuses[code.name] += 1
            if code in SERVER_FAULTS:
                tally.server_errors.append((method, code.name, details[:300]))
    return tally


def _call(caller: Callable[..., Any], data: bytes, streaming: bool, timeout_s: float
          ) -> tuple[grpc.StatusCode, str]:
    try:
        if streaming:
            replies = list(caller(iter([data, data]), timeout=timeout_s))
            for reply in replies:
                answer = pb.ModelStreamInferResponse.FromString(reply)
                if "details are in the server log" in answer.error_message:  # a 500's text
                    return grpc.StatusCode.INTERNAL, answer.error_message
        else:
            caller(data, timeout=timeout_s)
    except grpc.RpcError as exc:
        return exc.code(), str(exc.details() or "")
    return grpc.StatusCode.OK, ""
