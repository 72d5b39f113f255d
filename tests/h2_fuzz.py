"""An HTTP/2 frame fuzzer for the gRPC port: random frames after a valid preface.

Each case opens a connection, sends the preface and SETTINGS, then a seeded mix of near-valid
gRPC calls (odd headers, bodies, flags) and random frames (every type, odd flags, stream ids,
payloads, lying lengths), and ends with a PING. The server must answer (GOAWAY, RST_STREAM, a
gRPC status) or ignore, never fail: a fault is a GOAWAY or RST_STREAM with INTERNAL_ERROR, a
gRPC status INTERNAL/UNKNOWN/DATA_LOSS, or an HTTP 5xx.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import time
from collections import Counter
from dataclasses import dataclass, field

from serval.http2 import frames as h2
from serval.http2.frames import ProtocolError
from serval.http2.hpack import HpackDecoder, encode_headers
from tests.grpc_fuzz import infer_message, mutate, valid_linear

PING_PAYLOAD = b"fuzzping"
GRPC_FAULTS = {"2", "13", "15"}  # UNKNOWN, INTERNAL, DATA_LOSS
ERROR_NAMES = {0: "NO_ERROR", 1: "PROTOCOL_ERROR", 2: "INTERNAL_ERROR", 3: "FLOW_CONTROL_ERROR",
               4: "SETTINGS_TIMEOUT", 5: "STREAM_CLOSED", 6: "FRAME_SIZE_ERROR",
               7: "REFUSED_STREAM", 8: "CANCEL", 9: "COMPRESSION_ERROR", 10: "CONNECT_ERROR",
               11: "ENHANCE_YOUR_CALM", 12: "INADEQUATE_SECURITY", 13: "HTTP_1_1_REQUIRED"}
METHODS = ["ModelInfer", "ModelInfer", "ModelInfer", "ModelMetadata", "ServerLive",
           "ModelStreamInfer", "Nope"]


@dataclass
class H2Tally:
    """Outcomes by kind (goaway:CODE, rst:CODE, grpc:STATUS, ping-ack, closed, timeout)."""

    outcomes: Counter[str] = field(default_factory=Counter)
    cases: int = 0
    server_errors: list[tuple[int, str]] = field(default_factory=list)  # (case seed, what)

    def summary(self) -> str:
        counts = ", ".join(f"{kind}: {n}" for kind, n in sorted(self.outcomes.items()))
        return f"{self.cases} connections ({counts}); server faults: {len(self.server_errors)}"


def _grpc_headers(rng: random.Random, stream_id: int, method: str) -> list[tuple[str, str]]:
    headers = [(":method", "POST"), (":scheme", "http"),
               (":path", f"/inference.GRPCInferenceService/{method}"),
               (":authority", "localhost"), ("content-type", "application/grpc"),
               ("te", "trailers")]
    roll = rng.random()
    if roll < 0.08:
        headers[4] = ("content-type", rng.choice(["text/plain", "application/json", "",
                                                  "application/grpc+proto", "application/grpcx"]))
    elif roll < 0.14:
        del headers[rng.randrange(len(headers))]
    elif roll < 0.18:
        headers.append(("grpc-timeout", rng.choice(["1m", "0S", "99999999H", "x", "1", "-1S",
                                                    "100000000n"])))
    elif roll < 0.22:
        headers.append(("grpc-encoding", rng.choice(["gzip", "identity", "br", "ü"])))
    elif roll < 0.26:
        headers.append(("authorization", rng.choice(["Bearer x", "Bearer", "\xff\xfe"])))
    elif roll < 0.30:
        headers.insert(rng.randrange(len(headers) + 1),
                       (rng.choice([":path", ":method", ":bogus", "Upper", "connection",
                                    "te", ""]), rng.choice(["", "x", "POST", "gzip"])))
    elif roll < 0.33:
        headers[0] = (":method", rng.choice(["GET", "PUT", "", "CONNECT"]))
    return headers


def _grpc_body(rng: random.Random, models: list[str], input_names: list[str]) -> bytes:
    message = (valid_linear(rng.randint(1, 3)) if rng.random() < 0.4
               else infer_message(rng, models, input_names)).SerializeToString()
    if rng.random() < 0.2:
        message = mutate(rng, message)
    flag, length = 0, len(message)
    roll = rng.random()
    if roll < 0.05:
        flag = rng.choice([1, 2, 255])
    elif roll < 0.10:
        length = rng.choice([0, length + 10, 2**32 - 1, max(length - 3, 0)])
    body = struct.pack(">BI", flag, length) + message
    if rng.random() < 0.05:
        body = body[:rng.randrange(len(body) + 1)]
    return body


def _call_frames(rng: random.Random, stream_id: int, models: list[str],
                 input_names: list[str]) -> tuple[list[bytes], bool]:
    """A gRPC call, near valid: HEADERS (maybe split into CONTINUATION) and DATA frames;
    True when the call is complete (END_STREAM sent, not reset), so an answer is due."""
    method = rng.choice(METHODS)
    block = encode_headers(_grpc_headers(rng, stream_id, method))
    out: list[bytes] = []
    if rng.random() < 0.15 and len(block) > 2:  # split the block across CONTINUATION
        cut = rng.randrange(1, len(block))
        out.append(h2.frame(h2.HEADERS, 0, stream_id, block[:cut]))
        out.append(h2.frame(h2.CONTINUATION, h2.END_HEADERS, stream_id, block[cut:]))
    else:
        flags = h2.END_HEADERS | (h2.END_STREAM if rng.random() < 0.05 else 0)
        out.append(h2.frame(h2.HEADERS, flags, stream_id, block))
        if flags & h2.END_STREAM:
            return out, True
    body = _grpc_body(rng, models, input_names)
    pieces = [body] if rng.random() < 0.7 else [body[:len(body) // 2], body[len(body) // 2:]]
    ended = False
    for index, piece in enumerate(pieces):
        last = index == len(pieces) - 1
        end = h2.END_STREAM if last and rng.random() < 0.9 else 0
        ended = bool(end)
        flags = end
        if rng.random() < 0.05:
            flags |= h2.PADDED
            piece = bytes([rng.randint(0, 20)]) + piece + b"\x00" * rng.randint(0, 20)
        out.append(h2.frame(h2.DATA, flags, stream_id, piece))
    if rng.random() < 0.1:
        out.append(h2.rst_stream(stream_id, rng.randrange(14)))
        ended = False
    return out, ended


def _random_frame(rng: random.Random, streams: list[int]) -> bytes:
    kind = rng.choice([*list(range(10)), 10, 32, 255])
    stream_id = rng.choice([*streams, 0, 0, 2, 2 ** 31 - 1, rng.getrandbits(32)])
    flags = rng.getrandbits(8) if rng.random() < 0.3 else rng.choice([0, 1, 4, 5, 8, 0x20])
    if kind == h2.SETTINGS:
        pairs = [(rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 0x99]),
                  rng.choice([0, 1, 2, 100, 16_383, 16_384, 2**24, 2**31 - 1, 2**31, 2**32 - 1]))
                 for _ in range(rng.randint(0, 3))]
        payload = b"".join(struct.pack(">HI", k, v) for k, v in pairs)
        if rng.random() < 0.1:
            payload += b"\x00"
    elif kind == h2.WINDOW_UPDATE:
        payload = struct.pack(">I", rng.choice([0, 1, 65_535, 2**31 - 1, 2**32 - 1]))
    elif kind == h2.RST_STREAM:
        payload = struct.pack(">I", rng.choice([0, 1, 2, 8, 99]))
    elif kind == h2.PRIORITY:
        payload = struct.pack(">IB", rng.choice([0, stream_id, 2**31 + 1]), rng.getrandbits(8))
    elif kind == h2.PING:
        payload = rng.randbytes(rng.choice([8, 8, 0, 7, 9]))
    elif kind == h2.GOAWAY:
        payload = struct.pack(">II", rng.getrandbits(31), rng.randrange(14)) + rng.randbytes(
            rng.randint(0, 8))
    elif kind in (h2.HEADERS, h2.CONTINUATION, h2.PUSH_PROMISE):
        payload = rng.choice([rng.randbytes(rng.randint(0, 40)),
                              b"\xff\xff\xff\xff\x0f",  # an index far beyond any table
                              b"\x3f\xe1\x1f",  # a dynamic table size update
                              encode_headers([(":path", "/x"), ("a", "b")])])
    else:
        payload = rng.randbytes(rng.choice([0, 0, 4, 16, 100]))
    return h2.frame(kind, flags, stream_id, payload)


def case_frames(rng: random.Random, models: list[str], input_names: list[str]
                ) -> tuple[bytes, set[int]]:
    """The bytes one case sends after the preface (its SETTINGS included), and the streams
    whose calls it completed (each is due an answer unless the connection ends)."""
    settings: dict[int, int] = {}
    if rng.random() < 0.2:
        settings[rng.choice([1, 2, 3, 4, 5, 6, 0x42])] = rng.choice(
            [0, 1, 2, 16_384, 2**24 - 1, 2**31 - 1, 2**32 - 1])
    out = [h2.settings_frame(settings)]
    if rng.random() < 0.5:
        out.append(h2.frame(h2.SETTINGS, h2.ACK, 0))
    next_stream, streams, due = 1, [], set()
    for _ in range(rng.randint(1, 6)):
        if rng.random() < 0.5:
            stream_id = next_stream if rng.random() < 0.9 else rng.choice([2, 1, 0])
            next_stream += 2
            streams.append(stream_id)
            frames, ended = _call_frames(rng, stream_id, models, input_names)
            out += frames
            if ended:
                due.add(stream_id)
        else:
            frame = _random_frame(rng, streams)
            out.append(frame)
            if frame[3] == h2.RST_STREAM:
                due.discard(int.from_bytes(frame[5:9], "big") & 0x7FFF_FFFF)
    if rng.random() < 0.01:  # a frame whose length field lies (the PING after it is swallowed)
        out.append(struct.pack(">BHBBI", rng.getrandbits(8), rng.getrandbits(16),
                               rng.randrange(10), 0, 1) + rng.randbytes(rng.randint(0, 30)))
    return b"".join(out), due


def run_h2_fuzz(host: str, port: int, cases: int, models: list[str], input_names: list[str],
                seed: int = 0, timeout_s: float = 2.0) -> H2Tally:
    """One connection per case; every answer read until our PING's ACK, a close or a GOAWAY."""
    tally = H2Tally()
    for index in range(cases):
        case_seed = seed * 1_000_003 + index
        rng = random.Random(case_seed)
        frames, due = case_frames(rng, models, input_names)
        payload = h2.PREFACE + frames + h2.frame(h2.PING, 0, 0, PING_PAYLOAD)
        outcomes = _exchange(host, port, payload, due, timeout_s)
        tally.cases += 1
        for outcome in outcomes:
            if outcome.startswith("grpc-message:"):
                if tally.server_errors and tally.server_errors[-1][0] == case_seed:
                    tally.server_errors[-1] = (case_seed, tally.server_errors[-1][1] +
                                               " " + outcome[13:])
                continue
            tally.outcomes[outcome] += 1
            if outcome in ("goaway:INTERNAL_ERROR", "rst:INTERNAL_ERROR") or (
                    outcome.startswith("grpc:") and outcome[5:] in GRPC_FAULTS) or (
                    outcome.startswith("http:5")):
                tally.server_errors.append((case_seed, outcome))
    return tally


def _exchange(host: str, port: int, payload: bytes, due: set[int], timeout_s: float
              ) -> list[str]:
    """Send one case; what came back (until the PING's ACK and every due answer)."""
    outcomes: list[str] = []
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        with contextlib.suppress(OSError):  # it may close early (a GOAWAY is still to read)
            sock.sendall(payload)
        reader = h2.FrameReader(2**24)
        decoder = HpackDecoder()
        blocks: dict[int, bytes] = {}
        pinged, open_streams = False, set(due)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                return [*outcomes, "reset"]
            if not data:
                return [*outcomes, "closed"]
            try:
                for kind, flags, stream_id, body in reader.feed(data):
                    done = _frame_outcome(kind, flags, stream_id, body, decoder, blocks,
                                          outcomes, open_streams)
                    if kind == h2.PING and flags & h2.ACK and body == PING_PAYLOAD:
                        pinged = True
                    if done:
                        return outcomes
            except ProtocolError as exc:
                return [*outcomes, f"bad-answer:{exc}"]
            if pinged and not open_streams:
                return [*outcomes, "ping-ack"]
        return [*outcomes, "timeout"]


def _frame_outcome(kind: int, flags: int, stream_id: int, body: bytes, decoder: HpackDecoder,
                   blocks: dict[int, bytes], outcomes: list[str], open_streams: set[int]
                   ) -> bool:
    """Note what one server frame says; True when the connection is over (GOAWAY)."""
    if kind == h2.GOAWAY and len(body) >= 8:
        code = struct.unpack(">I", body[4:8])[0]
        outcomes.append(f"goaway:{ERROR_NAMES.get(code, code)}")
        return True
    if kind == h2.RST_STREAM and len(body) >= 4:
        open_streams.discard(stream_id)
        outcomes.append(f"rst:{ERROR_NAMES.get(struct.unpack('>I', body[:4])[0], 'other')}")
    elif kind in (h2.HEADERS, h2.CONTINUATION):
        block = blocks.get(stream_id, b"") + (h2.strip_padding(flags, body, 5)
                                              if kind == h2.HEADERS else body)
        if flags & h2.END_HEADERS:
            blocks.pop(stream_id, None)
            headers = decoder.decode(block)
            for name, value in headers:
                if name == "grpc-status":
                    outcomes.append(f"grpc:{value}")
                    if value in GRPC_FAULTS:
                        message = dict(headers).get("grpc-message", "")
                        outcomes.append(f"grpc-message:{message[:120]}")
                elif name == ":status" and value != "200":
                    outcomes.append(f"http:{value}")
        else:
            blocks[stream_id] = block
        if flags & h2.END_STREAM:
            open_streams.discard(stream_id)
    elif kind == h2.DATA and flags & h2.END_STREAM:
        open_streams.discard(stream_id)
    return False
