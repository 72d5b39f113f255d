"""A raw HTTP/2 client for attacks: hand-built frames on a blocking socket, and what came back.

Built on serval.http2's frame and HPACK helpers only (never serval.server.grpc: its protobuf
symbols clash with tritonclient's).
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field

import numpy as np
from tritonclient.grpc import service_pb2

from serval.http2 import frames as h2
from serval.http2.hpack import HpackDecoder, encode_headers
from tests.security.conftest import connect

SERVICE = "/inference.GRPCInferenceService/"
_PREFIX = struct.Struct(">BL")


def request_block(method: str = "ModelInfer", content_type: str = "application/grpc",
                  extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    return encode_headers([(":method", "POST"), (":scheme", "http"),
                           (":path", SERVICE + method), (":authority", "localhost"),
                           ("content-type", content_type), ("te", "trailers"), *extra])


def message(payload: bytes) -> bytes:
    return _PREFIX.pack(0, len(payload)) + payload


def infer_request(model: str = "linear") -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 8])
    request.raw_input_contents.append(np.full((1, 8), 0.25, np.float32).tobytes())
    return bytes(request.SerializeToString())


def headers(stream_id: int, block: bytes | None = None, end_stream: bool = False) -> bytes:
    flags = h2.END_HEADERS | (h2.END_STREAM if end_stream else 0)
    return h2.frame(h2.HEADERS, flags, stream_id, request_block() if block is None else block)


def data(stream_id: int, payload: bytes, end_stream: bool = False) -> bytes:
    return h2.frame(h2.DATA, h2.END_STREAM if end_stream else 0, stream_id, payload)


@dataclass
class Seen:
    """What the server sent: frames by type, GOAWAY's code, whether it closed."""

    frames: list[tuple[int, int, int, bytes]] = field(default_factory=list)
    goaway: int | None = None
    closed: bool = False

    def of(self, kind: int) -> list[tuple[int, int, int, bytes]]:
        return [f for f in self.frames if f[0] == kind]

    def resets(self) -> dict[int, int]:
        """stream id -> RST_STREAM error code."""
        return {sid: struct.unpack(">L", payload)[0]
                for kind, _, sid, payload in self.frames if kind == h2.RST_STREAM}

    def statuses(self) -> dict[int, str]:
        """stream id -> grpc-status or :status, from the HEADERS the server sent."""
        decoder, out = HpackDecoder(), {}
        for kind, _, sid, payload in self.frames:
            if kind == h2.HEADERS:
                for name, value in decoder.decode(payload):
                    if name in ("grpc-status", ":status") and (
                            name == "grpc-status" or value != "200"):
                        out[sid] = value
        return out


class RawH2:
    """One attacking connection."""

    def __init__(self, port: int, settings: dict[int, int] | None = None,
                 preface: bool = True) -> None:
        self.sock = connect(port)
        self.reader = h2.FrameReader(h2.MAX_FRAME_BYTES)
        self.seen = Seen()
        if preface:
            self.send(h2.PREFACE + h2.settings_frame(settings or {}))

    def send(self, *chunks: bytes) -> bool:
        """False once the server has closed (or stopped reading for the socket timeout)."""
        try:
            self.sock.sendall(b"".join(chunks))
            return True
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            return False

    def flood(self, chunk: bytes, seconds: float) -> int:
        """Send chunk again and again for up to `seconds`, reading what comes back, until the
        server closes; returns how many were sent."""
        self.sock.settimeout(0.2)
        sent, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline and not self.seen.closed:
            try:
                self.sock.sendall(chunk)
                sent += 1
            except TimeoutError:
                pass  # the server stopped reading us: fine, read what it says
            except (BrokenPipeError, ConnectionResetError):
                break
            self.read(0.0)
        return sent

    def read(self, seconds: float) -> Seen:
        """Read for up to `seconds` (0: only what is there), or until the server closes."""
        deadline = time.monotonic() + seconds
        while not self.seen.closed:
            left = deadline - time.monotonic()
            self.sock.settimeout(max(left, 0.0001) if seconds else 0.0)
            try:
                chunk = self.sock.recv(1 << 20)
            except (BlockingIOError, TimeoutError):
                if seconds == 0 or left <= 0:
                    break
                continue
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if not chunk:
                self.seen.closed = True
                break
            for item in self.reader.feed(chunk):
                self.seen.frames.append(item)
                if item[0] == h2.GOAWAY:
                    self.seen.goaway = struct.unpack(">L", item[3][4:8])[0]
        return self.seen

    def closed_with(self, seconds: float) -> int | None:
        """Read until the server closes (fails after `seconds`); its GOAWAY code, if any."""
        started = time.monotonic()
        self.read(seconds)
        assert self.seen.closed, f"still open after {seconds} s"
        self.elapsed_s = time.monotonic() - started
        return self.seen.goaway

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawH2:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def window_update(stream_id: int, increment: int) -> bytes:
    """Unlike frames.window_update, allows 0 and the reserved bit."""
    return h2.frame(h2.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", increment))
