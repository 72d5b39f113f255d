"""System shared memory vs binary HTTP vs gRPC, end to end, for 1 KB, 1 MB and 16 MB tensors.

One server, an identity model (FP32 [-1], no batching); one client calls in turn (shm, http,
grpc, shm, http, grpc, ...) so the box's noise falls on all three alike. A call is end to end:
  shm   write the input into a registered region, infer over HTTP with input and output in
        shared memory, copy the output out of its region
  http  tritonclient.http with binary tensor data in and out
  grpc  tritonclient.grpc (raw contents in and out)
Prints the median per call, MB/s (input bytes per second) and the ratios shm/http and
shm/grpc, with PASS/MISS against the goal: at 16 MB, shm >= 3x binary HTTP.

    flock /tmp/serval-cpu.lock .venv/bin/python bench/shm.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers

MODEL = "identity_fp32"
SIZES = {"1 KB": 1 << 10, "1 MB": 1 << 20, "16 MB": 16 << 20}
GOAL_SIZE, GOAL_RATIO = "16 MB", 3.0
Call = Callable[[], np.ndarray]


def main() -> None:
    args = _parse_args()
    repository = _identity_repository(Path(tempfile.mkdtemp(prefix="serval-shm-bench-")))
    port, grpc_port = servers.free_ports(2)
    command = servers.serval_command(repository, port, 1, grpc_port)
    log = repository.parent / f"{repository.name}.log"
    with servers.running(command, port, "/v2/health/ready", log):
        http = httpclient.InferenceServerClient(f"{servers.HOST}:{port}",
                                                connection_timeout=120, network_timeout=120)
        grpc = grpcclient.InferenceServerClient(f"{servers.HOST}:{grpc_port}")
        print(f"cores: {os.cpu_count()} (shared box: compare ratios, not absolute figures)")
        print(f"{'size':>6} {'mode':>5} {'median ms':>10} {'MB/s':>9} {'calls':>6}")
        ratios = {size: _one_size(http, grpc, size, nbytes, args.calls, args.seconds)
                  for size, nbytes in SIZES.items()}
    print()
    for size, (over_http, over_grpc) in ratios.items():
        print(f"{size:>6}: shm/http {over_http:.2f}x  shm/grpc {over_grpc:.2f}x")
    saved_ms = _copy_ms(SIZES[GOAL_SIZE])
    print(f"the server copies each input out of its region (a mapping read in place would die "
          f"with SIGBUS if the client shrank its object): ~{saved_ms:.1f} ms per {GOAL_SIZE} "
          "call here, included above")
    passed = ratios[GOAL_SIZE][0] >= GOAL_RATIO
    print(f"{'PASS' if passed else 'MISS'}: at {GOAL_SIZE} shm is {ratios[GOAL_SIZE][0]:.2f}x "
          f"binary HTTP end to end (goal >= {GOAL_RATIO:.0f}x)")


def _one_size(http: Any, grpc: Any, size: str, nbytes: int, calls: int,
              seconds: float) -> tuple[float, float]:
    data = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
    key = f"/serval_bench_{os.getpid()}"
    handles = [shm.create_shared_memory_region(name, key + name, nbytes)
               for name in ("_in", "_out")]
    try:
        http.unregister_system_shared_memory()
        for name in ("_in", "_out"):
            http.register_system_shared_memory(name, key + name, nbytes)
        modes = {"shm": _shm_call(http, handles, data), "http": _http_call(http, data),
                 "grpc": _grpc_call(grpc, data)}
        for call in modes.values():  # correct, and warm
            np.testing.assert_array_equal(call(), data)
        times = _alternate(modes, calls, seconds)
    finally:
        http.unregister_system_shared_memory()
        for handle in handles:
            shm.destroy_shared_memory_region(handle)
    medians = {mode: statistics.median(spent) for mode, spent in times.items()}
    for mode, median_s in medians.items():
        print(f"{size:>6} {mode:>5} {median_s * 1e3:10.3f} {nbytes / median_s / 1e6:9.1f} "
              f"{len(times[mode]):6d}")
    return medians["http"] / medians["shm"], medians["grpc"] / medians["shm"]


def _copy_ms(nbytes: int) -> float:
    """What one copy of a tensor of nbytes costs on this box (the median of 20)."""
    source = np.ones(nbytes // 4, dtype=np.float32)
    spent = []
    for _ in range(20):
        start = time.perf_counter()
        np.array(source, copy=True)
        spent.append(time.perf_counter() - start)
    return statistics.median(spent) * 1e3


def _alternate(modes: dict[str, Call], calls: int, seconds: float) -> dict[str, list[float]]:
    """Each mode in turn, until `calls` rounds or `seconds` have passed (at least 5 rounds)."""
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    deadline = time.perf_counter() + seconds
    for round_index in range(calls):
        if round_index >= 5 and time.perf_counter() > deadline:
            break
        for mode, call in modes.items():
            start = time.perf_counter()
            call()
            times[mode].append(time.perf_counter() - start)
    return times


def _shm_call(http: Any, handles: list[Any], data: np.ndarray) -> Call:
    nbytes = data.nbytes
    inputs = [httpclient.InferInput("IN", [data.size], "FP32")]
    inputs[0].set_shared_memory("_in", nbytes)
    outputs = [httpclient.InferRequestedOutput("OUT", binary_data=True)]
    outputs[0].set_shared_memory("_out", nbytes)

    def call() -> np.ndarray:
        shm.set_shared_memory_region(handles[0], [data])
        http.infer(MODEL, inputs, outputs=outputs)
        return np.array(shm.get_contents_as_numpy(handles[1], np.float32, [data.size]))
    return call


def _http_call(http: Any, data: np.ndarray) -> Call:
    def call() -> np.ndarray:
        tensor = httpclient.InferInput("IN", [data.size], "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        result = http.infer(MODEL, [tensor], outputs=[
            httpclient.InferRequestedOutput("OUT", binary_data=True)])
        return np.asarray(result.as_numpy("OUT"))
    return call


def _grpc_call(grpc: Any, data: np.ndarray) -> Call:
    def call() -> np.ndarray:
        tensor = grpcclient.InferInput("IN", [data.size], "FP32")
        tensor.set_data_from_numpy(data)
        return np.asarray(grpc.infer(MODEL, [tensor]).as_numpy("OUT"))
    return call


def _identity_repository(root: Path) -> Path:
    """identity_fp32: FP32 [-1] -> the same, no batch axis (max_batch_size 0)."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["IN"], ["OUT"])], MODEL,
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    version = root / MODEL / "1"
    version.mkdir(parents=True)
    onnx.save(model, str(version / "model.onnx"))
    (root / MODEL / "config.yaml").write_text("max_batch_size: 0\n")
    return root


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="rounds per size at most")
    parser.add_argument("--seconds", type=float, default=20.0, help="time per size at most")
    return parser.parse_args()


if __name__ == "__main__":
    main()
