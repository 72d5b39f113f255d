"""A raw HTTP/2 client for attacks: hand-built frames on a blocking socket, and what came back.

Built on serval.http2's frame and HPACK helpers only.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from tritonclient.grpc import service_pb2

from serval.http2 import frames as h2
from serval.http2.hpack import HpackDecoder, encode_headers
from tests.security.conftest import Watch, connect

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
                 preface: bool = True, receive_buffer: int = 0) -> None:
        if receive_buffer:  # set before connecting: it also bounds the window it advertises
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            self.sock.settimeout(10.0)
            self.sock.connect(("127.0.0.1", port))
        else:
            self.sock = connect(port)
        self.reader = h2.FrameReader(h2.MAX_FRAME_BYTES)
        self.seen = Seen()
        self.tail = b""  # the last bytes read unparsed
        self.connection_window = h2.DEFAULT_WINDOW_BYTES  # what we may send (flow control)
        self.stream_initial = h2.DEFAULT_WINDOW_BYTES
        self.stream_credit: dict[int, int] = {}  # per stream: granted minus sent
        self.elapsed_s = 0.0
        if preface:
            self.send(h2.PREFACE + h2.settings_frame(settings or {}))

    def send(self, *chunks: bytes) -> bool:
        """False once the server has closed (or stopped reading for the socket timeout)."""
        self.sock.settimeout(5.0)
        try:
            self.sock.sendall(b"".join(chunks))
            return True
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            return False

    def flood(self, chunk: bytes, seconds: float, read: bool = True) -> int:
        """Send chunk again and again for up to `seconds` (reading what comes back unless told
        not to) until the server closes; returns how many were sent."""
        sent, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline and not self.seen.closed:
            self.sock.settimeout(0.2)
            try:
                self.sock.sendall(chunk)
                sent += 1
            except TimeoutError:
                pass  # the server stopped reading us: fine, read what it says
            except (BrokenPipeError, ConnectionResetError):
                break
            if read:
                self.read(0.0)
        return sent

    def read(self, seconds: float, parse: bool = True) -> Seen:
        """Read for up to `seconds` (0: only what is there), or until the server closes;
        parse=False throws the bytes away (a cheap attacker leaves the GIL to the good clients)."""
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
            if not parse:
                self.tail = (self.tail + chunk)[-4096:]
                continue
            for item in self.reader.feed(chunk):
                self._follow(item)
                self.seen.frames.append(item)
                if item[0] == h2.GOAWAY:
                    self.seen.goaway = struct.unpack(">L", item[3][4:8])[0]
        return self.seen

    def _follow(self, item: tuple[int, int, int, bytes]) -> None:
        kind, flags, stream_id, payload = item
        if kind == h2.SETTINGS and not flags & h2.ACK:
            self.stream_initial = h2.parse_settings(payload).get(h2.INITIAL_WINDOW_SIZE,
                                                                 self.stream_initial)
        elif kind == h2.WINDOW_UPDATE:
            increment = struct.unpack(">L", payload)[0]
            if stream_id:
                self.stream_credit[stream_id] = self.stream_credit.get(stream_id, 0) + increment
            else:
                self.connection_window += increment

    def send_flow(self, stream_id: int, payload: bytes, seconds: float, end_stream: bool = False,
                  stream_window: bool = True, frame_bytes: int = 65_536) -> int:
        """DATA within the server's windows (the stream's too unless told not to), for up to
        `seconds`; returns the bytes sent."""
        sent, deadline = 0, time.monotonic() + seconds
        view = memoryview(payload)
        while sent < len(payload) and not self.seen.closed and time.monotonic() < deadline:
            self.read(0.0)
            room = min(len(payload) - sent, self.connection_window, frame_bytes)
            if stream_window:
                room = min(room, self.stream_initial + self.stream_credit.get(stream_id, 0))
            if room <= 0:
                self.read(0.02)
                continue
            last = end_stream and sent + room == len(payload)
            if not self.send(data(stream_id, bytes(view[sent:sent + room]), last)):
                break
            sent += room
            self.connection_window -= room
            self.stream_credit[stream_id] = self.stream_credit.get(stream_id, 0) - room
        return sent

    def closed_with(self, seconds: float) -> int | None:
        """Read until the server closes (fails after `seconds`); its GOAWAY code, if any."""
        started = time.monotonic()
        self.read(seconds)
        assert self.seen.closed, f"still open after {seconds} s"
        self.elapsed_s = time.monotonic() - started
        if self.seen.goaway is None and self.tail:  # read unparsed: find the last GOAWAY
            at = self.tail.rfind(b"\x07\x00\x00\x00\x00\x00")
            if at >= 3 and len(self.tail) >= at + 14:
                self.seen.goaway = struct.unpack(">L", self.tail[at + 10:at + 14])[0]
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


def rounds(seconds: float) -> Iterator[int]:
    """0, 1, 2, ... for `seconds` (at least one): repeat an attack while good clients watch."""
    deadline = time.monotonic() + seconds
    count = 0
    while count == 0 or time.monotonic() < deadline:
        yield count
        count += 1


def report(name: str, result: Watch, closed_s: float | None = None) -> None:
    """One line of figures for the record (pytest -s shows them)."""
    worst = max((client.worst_s for client in result.clients), default=0.0)
    calls = sum(client.calls for client in result.clients)
    closed = f", attacker closed {closed_s * 1000:.0f} ms after its last send" if closed_s else ""
    print(f"\n[{name}] RSS +{result.growth_mib:.1f} MiB, good clients worst "
          f"{worst * 1000:.0f} ms over {calls} calls{closed}")
