"""Sanity-check one answer before a measurement: 200, every output, right shape, right values.

The request is sent exactly as the load generator will send it (the same pre-encoded bytes);
the answer (v2 JSON, or JSON header + binary tensors) is compared with the engine's own output
for the same inputs, computed in this process.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

import httptools
import numpy as np
import orjson

from bench.workloads import ModelSpec
from serval.protocol.dtypes import numpy_dtype


class CheckFailed(RuntimeError):
    """The server's answer is not what the model computes."""


@dataclass
class _Answer:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    complete: bool = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


def fetch(host: str, port: int, request: bytes, timeout_s: float = 30.0) -> _Answer:
    """Send one pre-encoded request on a fresh connection and read the whole answer."""
    answer = _Answer()
    parser = httptools.HttpResponseParser(answer)
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(request)
        while not answer.complete:
            data = sock.recv(1 << 16)
            if not data:
                raise CheckFailed("connection closed before a complete answer")
            parser.feed_data(data)
    answer.status = parser.get_status_code()
    return answer


def check_answer(host: str, port: int, request: bytes, spec: ModelSpec,
                 expected: dict[str, np.ndarray], label: str) -> None:
    """Raise CheckFailed unless the answer is 200 with every output, shape and value right."""
    answer = fetch(host, port, request)
    if answer.status != 200:
        raise CheckFailed(f"{label}: HTTP {answer.status}: {bytes(answer.body[:300])!r}")
    try:
        outputs = decode_outputs(answer)
    except (ValueError, KeyError, TypeError) as exc:  # orjson.JSONDecodeError is a ValueError
        raise CheckFailed(f"{label}: undecodable answer ({exc}): {bytes(answer.body[:300])!r}"
                          ) from exc
    for out in spec.outputs:
        if out.name not in outputs:
            raise CheckFailed(f"{label}: output '{out.name}' missing (got {sorted(outputs)})")
        got, want = outputs[out.name], expected[out.name]
        if got.shape != want.shape:
            raise CheckFailed(f"{label}: '{out.name}' shape {got.shape}, expected {want.shape}")
        if not np.allclose(got, want, rtol=1e-3, atol=1e-4):
            worst = float(np.max(np.abs(got.astype(np.float64) - want)))
            raise CheckFailed(f"{label}: '{out.name}' differs from the engine by {worst:.3g}")


def decode_outputs(answer: _Answer) -> dict[str, np.ndarray]:
    """Outputs of a v2 answer, JSON or binary-tensor, as numpy arrays."""
    header_length = answer.headers.get("inference-header-content-length")
    body = bytes(answer.body)
    json_part = body[:int(header_length)] if header_length else body
    binary, offset = body[len(json_part):], 0
    arrays = {}
    for out in orjson.loads(json_part).get("outputs", []):
        dtype, shape = numpy_dtype(out["datatype"]), tuple(out["shape"])
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            raw = binary[offset:offset + int(size)]
            offset += int(size)
            arrays[out["name"]] = np.frombuffer(raw, dtype=dtype)
        else:
            arrays[out["name"]] = np.asarray(out["data"], dtype=dtype)
        arrays[out["name"]] = arrays[out["name"]].reshape(shape)
    return arrays


def check_grpc_answer(target: str, request: bytes, spec: ModelSpec,
                      expected: dict[str, np.ndarray], label: str) -> None:
    """Raise CheckFailed unless ModelInfer answers every output right (raw contents)."""
    import grpc

    from serval.loadtest.grpc_closed_loop import MODEL_INFER
    from serval.protocol.grpc import grpc_service_pb2 as pb

    with grpc.insecure_channel(target) as channel:
        try:
            raw = channel.unary_unary(MODEL_INFER)(request, timeout=30)
        except grpc.RpcError as exc:
            raise CheckFailed(f"{label}: {exc.code()}: {exc.details()}") from exc
    response = pb.ModelInferResponse.FromString(raw)
    outputs = {out.name: np.frombuffer(data, dtype=numpy_dtype(out.datatype)).reshape(out.shape)
               for out, data in zip(response.outputs, response.raw_output_contents, strict=True)}
    for out in spec.outputs:
        got, want = outputs.get(out.name), expected[out.name]
        if got is None or got.shape != want.shape or not np.allclose(got, want, 1e-3, 1e-4):
            raise CheckFailed(f"{label}: output '{out.name}' missing or wrong")
