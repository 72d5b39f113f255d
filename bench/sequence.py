"""Sequence batching: `lstm_step` (one token per request, h and c kept by the server) with
--sequences concurrent sequences over gRPC streams, vs the same steps batched offline by raw
ONNX Runtime in-process (batch = --sequences, h and c carried by the script). Every sequence
the server completes is checked against the whole-sequence `lstm` run at once.

    .venv/bin/python bench/sequence.py --repository examples/models
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import procs, servers
from bench.sequence_client import LeanLanes, run_lean
from bench.zoo_sequence import HIDDEN

GOAL_SHARE = 0.80
POOL = 256  # distinct token sequences, reused round-robin


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = os.cpu_count() or 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def raw_steps_per_s(step_file: Path, pool: np.ndarray, batch: int, duration_s: float) -> float:
    """The engine alone: batches of `batch` sequences, one token each, state carried here."""
    step = session(step_file)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < duration_s:
        ids = pool[(done // pool.shape[1]) % (POOL - batch + 1):][:batch]
        h = np.zeros((batch, HIDDEN), np.float32)
        c = np.zeros_like(h)
        for t in range(pool.shape[1]):
            _, h, c = step.run(None, {"token_id": ids[:, t:t + 1], "h_in": h, "c_in": c})
        done += batch * pool.shape[1]
    return done / (time.perf_counter() - started)


def in_process_steps_per_s(repository: Path, pool: np.ndarray, sequences: int,
                           duration_s: float) -> float:
    """The Sequencer alone (no transport): `sequences` coroutines, one step each in flight."""
    from serval.backends.base import ModelVersionSpec
    from serval.backends.onnxruntime import OnnxRuntimeBackend
    from serval.batching.sequencer import Sequencer
    from serval.model_config import load_model_config
    from serval.protocol.types import InferRequest
    from serval.stats import ModelStats

    config = load_model_config(repository / "lstm_step" / "config.yaml")
    assert config.sequence_batching is not None
    spec = ModelVersionSpec("lstm_step", "1", repository / "lstm_step" / "1", config)
    engine = OnnxRuntimeBackend(cores=os.cpu_count() or 1).load(spec)
    steps = pool.shape[1]

    async def main() -> float:
        sequencer = Sequencer(engine, config.sequence_batching, ModelStats("lstm_step", "1"))
        deadline = time.perf_counter() + duration_s
        counter = iter(range(1, 1 << 62))

        async def lane() -> int:
            done = 0
            while time.perf_counter() < deadline:
                number = next(counter)
                for t in range(steps):
                    inputs = {"token_id": pool[number % POOL, t:t + 1].reshape(1, 1)}
                    parameters = {"sequence_id": number, "sequence_start": t == 0,
                                  "sequence_end": t == steps - 1}
                    await sequencer.infer(inputs, None, InferRequest(inputs,
                                                                     parameters=parameters))
                done += steps
            return done

        started = time.perf_counter()
        done = sum(await asyncio.gather(*(lane() for _ in range(sequences))))
        rate = done / (time.perf_counter() - started)
        await sequencer.close()
        return rate

    rate = asyncio.run(main())
    engine.unload()
    return rate


class Lanes:
    """`count` lanes, each running sequences back to back (pool rows round-robin)."""

    def __init__(self, pool: np.ndarray, count: int, deadline: float) -> None:
        self.pool, self.deadline = pool, deadline
        self.steps = pool.shape[1]
        self.next_sequence = 0
        self.finals: dict[int, np.ndarray] = {}  # sequence number -> last probabilities
        self.done_steps = 0
        self.lanes = count

    def new_sequence(self) -> int:
        self.next_sequence += 1
        return self.next_sequence


async def stream(grpc_url: str, lanes: Lanes, count: int) -> None:
    """One gRPC stream carrying `count` lanes; each step sent when the previous one answers."""
    import tritonclient.grpc.aio as grpcclient

    pending: asyncio.Queue[tuple[int, int] | None] = asyncio.Queue()
    for _ in range(count):
        pending.put_nowait((lanes.new_sequence(), 0))
    active = count

    async def requests():  # type: ignore[no-untyped-def]
        while (item := await pending.get()) is not None:
            number, t = item
            token = lanes.pool[number % POOL, t:t + 1].reshape(1, 1)
            tensor = grpcclient.InferInput("token_id", [1, 1], "INT64")
            tensor.set_data_from_numpy(token)
            yield {"model_name": "lstm_step", "inputs": [tensor], "request_id": f"{number}_{t}",
                   "sequence_id": number, "sequence_start": t == 0,
                   "sequence_end": t == lanes.steps - 1}

    async with grpcclient.InferenceServerClient(grpc_url) as client:
        async for result, error in client.stream_infer(inputs_iterator=requests()):
            if error is not None:
                raise RuntimeError(f"step refused: {error}")
            number, t = (int(part) for part in result.get_response().id.split("_"))
            lanes.done_steps += 1
            if t + 1 < lanes.steps:
                pending.put_nowait((number, t + 1))
                continue
            lanes.finals[number] = result.as_numpy("probabilities")[0]
            if time.perf_counter() < lanes.deadline:
                pending.put_nowait((lanes.new_sequence(), 0))
                continue
            active -= 1
            if not active:
                pending.put_nowait(None)
                break


async def served(grpc_url: str, pool: np.ndarray, sequences: int, streams: int,
                 duration_s: float) -> tuple[float, Lanes]:
    lanes = Lanes(pool, sequences, time.perf_counter() + duration_s)
    started = time.perf_counter()
    per_stream = [sequences // streams + (i < sequences % streams) for i in range(streams)]
    await asyncio.gather(*(stream(grpc_url, lanes, n) for n in per_stream if n))
    return lanes.done_steps / (time.perf_counter() - started), lanes


def worst_difference(lanes: Lanes | LeanLanes, whole_file: Path) -> float:
    """Max abs difference of every completed sequence's last answer vs the whole-run lstm
    (`finals` maps a pool row, or a sequence number counted round the pool, to it)."""
    (want,) = session(whole_file).run(["probabilities"], {"input_ids": lanes.pool})
    return max(float(np.abs(probabilities - want[number % POOL]).max())
               for number, probabilities in lanes.finals.items())


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", type=Path, default=Path("examples/models"))
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--client", choices=("lean", "tritonclient"), default="lean",
                        help="lean: Serval's own HTTP/2 client, steps pre-encoded (measures "
                        "the server); tritonclient: its aio stream_infer")
    args = parser.parse_args()
    step_file = args.repository / "lstm_step" / "1" / "model.onnx"
    whole_file = args.repository / "lstm" / "1" / "model.onnx"
    pool = np.random.default_rng(11).integers(0, 100_000, (POOL, 32), dtype=np.int64)
    raw = raw_steps_per_s(step_file, pool, args.sequences, args.duration)
    alone = in_process_steps_per_s(args.repository, pool, args.sequences, args.duration)
    repo = Path(tempfile.mkdtemp(prefix="serval-sequence-"))
    (repo / "lstm_step").symlink_to((args.repository / "lstm_step").resolve())
    port, grpc_port = servers.free_ports(2)
    command = servers.serval_command(repo, port, 1, grpc_port)
    with servers.running(command, port, "/v2/models/lstm_step/ready", repo / "server.log"):
        pid = procs.server_pid(port)
        cpu_before, client_before = _cpu_s(pid), time.process_time()
        if args.client == "lean":
            lanes = LeanLanes(pool, args.sequences, args.duration)
            rate = asyncio.run(run_lean(servers.HOST, grpc_port, lanes, args.streams))
        else:
            rate, lanes = asyncio.run(served(f"{servers.HOST}:{grpc_port}", pool,
                                             args.sequences, args.streams, args.duration))
        server_cpu = _cpu_s(pid) - cpu_before
        client_cpu = time.process_time() - client_before
    diff = worst_difference(lanes, whole_file)
    share = rate / raw
    print(f"lstm_step, {args.sequences} concurrent sequences x 32 steps, gRPC streams "
          f"({args.streams}), {os.cpu_count()} cores shared by client and server")
    print(f"  raw ONNX Runtime, batch {args.sequences} offline: {raw:9.0f} steps/s")
    print(f"  Sequencer in-process, no transport:       {alone:9.0f} steps/s  "
          f"= {alone / raw:.2f} of raw")
    print(f"  served (sequence batching):               {rate:9.0f} steps/s  "
          f"= {share:.2f} of raw (goal {GOAL_SHARE:.2f}: "
          f"{'met' if share >= GOAL_SHARE else 'MISSED'})")
    print(f"  CPU per served step: server {server_cpu / lanes.done_steps * 1e6:.0f} us, "
          f"client ({args.client}) {client_cpu / lanes.done_steps * 1e6:.0f} us")
    print(f"  {len(lanes.finals)} sequences checked against the whole-sequence lstm: "
          f"max|d| = {diff:.1e} ({'identical' if diff == 0 else 'within float tolerance'})")


if __name__ == "__main__":
    main()
