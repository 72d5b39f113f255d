"""A lean client for bench/sequence.py: `lanes` sequences kept running over gRPC streams on
Serval's own load-generator HTTP/2 client, every step's message pre-encoded (a lane reuses its
sequence id: a new START after the previous END), so the figure measures the server, not a
client library sharing its cores."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from serval.loadtest.grpc_client import GrpcClientConnection, grpc_message, request_headers
from serval.protocol.grpc import grpc_service_pb2 as pb

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
ROWS_PER_LANE = 4


def _message(lane: int, row: int, t: int, token: int, steps: int) -> bytes:
    request = pb.ModelInferRequest(model_name="lstm_step", id=f"{lane}_{row}_{t}")
    request.inputs.add(name="token_id", datatype="INT64", shape=[1, 1])
    request.raw_input_contents.append(np.array([[token]], np.int64).tobytes())
    request.parameters["sequence_id"].uint64_param = lane + 1
    request.parameters["sequence_start"].bool_param = t == 0
    request.parameters["sequence_end"].bool_param = t == steps - 1
    return grpc_message(request.SerializeToString())


class LeanLanes:
    """Lane i plays pool rows i, i+lanes, ... (ROWS_PER_LANE of them) round-robin."""

    def __init__(self, pool: np.ndarray, lanes: int, duration_s: float) -> None:
        self.pool, self.lanes = pool, lanes
        self.steps = pool.shape[1]
        self.deadline = time.perf_counter() + duration_s
        self.done_steps = 0
        self.finals: dict[int, np.ndarray] = {}  # pool row -> last probabilities
        self.messages = [[[_message(lane, row, t, int(pool[self.row(lane, row), t]),
                                    self.steps) for t in range(self.steps)]
                          for row in range(ROWS_PER_LANE)] for lane in range(lanes)]

    def row(self, lane: int, turn: int) -> int:
        return (lane + self.lanes * (turn % ROWS_PER_LANE)) % self.pool.shape[0]


async def run_lean(host: str, port: int, lanes: LeanLanes, streams: int) -> float:
    """Steps per second with every lane busy until the deadline (a lane finishes the
    sequence it is in)."""
    loop = asyncio.get_running_loop()
    finished = loop.create_future()
    position = {lane: (0, 0) for lane in range(lanes.lanes)}  # lane -> (turn, t)
    stream_of: dict[int, int] = {}
    active = [lanes.lanes]
    errors: list[str] = []

    def send(lane: int) -> None:
        turn, t = position[lane]
        connection.stream_send(stream_of[lane], lanes.messages[lane][turn % ROWS_PER_LANE][t])

    def on_message(_stream: int, payload: bytes) -> None:
        answer = pb.ModelStreamInferResponse.FromString(payload)
        if answer.error_message:
            errors.append(answer.error_message)
        lane, _row, t = (int(part) for part in answer.infer_response.id.split("_"))
        lanes.done_steps += 1
        turn, _ = position[lane]
        if t + 1 == lanes.steps:
            raw = answer.infer_response.raw_output_contents[0]
            lanes.finals[lanes.row(lane, turn)] = np.frombuffer(raw, np.float32)
            if time.perf_counter() >= lanes.deadline or errors:
                active[0] -= 1
                if not active[0] and not finished.done():
                    finished.set_result(None)
                return
            position[lane] = (turn + 1, 0)
        else:
            position[lane] = (turn, t + 1)
        send(lane)

    def on_end(_stream: int, status: int, message: str) -> None:
        if status != 0 and not finished.done():
            finished.set_exception(RuntimeError(f"stream ended: {status} {message}"))

    _, connection = await loop.create_connection(
        lambda: GrpcClientConnection(on_message, on_end), host, port)
    await connection.ready
    headers = request_headers(STREAM_INFER, f"{host}:{port}")
    opened = [connection.open_stream(headers) for _ in range(streams)]
    started = time.perf_counter()
    for lane in range(lanes.lanes):
        stream_of[lane] = opened[lane % streams]
        send(lane)
    connection.flush()
    try:
        await finished
    finally:
        elapsed = time.perf_counter() - started
        connection.close()
    if errors:
        raise RuntimeError(f"steps refused: {errors[0]}")
    return lanes.done_steps / elapsed
