"""How long one large or odd request holds the event loop: the longest wait of a liveness
probe (`/v2/health/live`, asked over and over on its own connection) while the request runs,
median of --runs, in one run. The requests are those that held the loop for 0.3-13 s before
they were moved off it (JSON tensors to a helper process, BYTES tensors to a thread, gRPC
typed contents read packed, load configs parsed on a thread); the probe's own round trip with
nothing else running is the floor.

    .venv/bin/python bench/loop_stalls.py
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import numpy as np
import orjson
from onnx import TensorProto, helper, save
from tritonclient.grpc import service_pb2, service_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import servers

ROWS = 100_000  # X: FP32 [ROWS, 16], 1.6M numbers
TEXTS = 500_000  # BYTES elements


class LiveProbes:
    """/v2/health/live asked over and over on one connection; each (sent, answered) time."""

    def __init__(self, port: int) -> None:
        self.port, self.times = port, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        connection = http.client.HTTPConnection(servers.HOST, self.port, timeout=60)
        while not self._stop.is_set():
            sent = time.perf_counter()
            connection.request("GET", "/v2/health/live")
            connection.getresponse().read()
            self.times.append((sent, time.perf_counter()))

    def longest_during(self, action: Callable[[], object]) -> float:
        start = time.perf_counter()
        action()
        end = time.perf_counter()
        return max((answered - sent for sent, answered in self.times
                    if answered > start and sent < end), default=end - start)

    def __enter__(self) -> LiveProbes:
        self._thread.start()
        while not self.times:
            time.sleep(0.001)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _save(root: Path, name: str, node: object, inputs: list, outputs: list) -> None:
    (root / name / "1").mkdir(parents=True)
    graph = helper.make_graph([node], name, inputs, outputs)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
         str(root / name / "1" / "model.onnx"))
    (root / name / "config.yaml").write_text("backend: onnxruntime\nmax_batch_size: 0\n")


def _repository(root: Path) -> Path:
    """`identity` FP32 [n, 16] and `cast` BYTES [n, 1] -> INT64."""
    _save(root, "identity", helper.make_node("Identity", ["X"], ["Y"]),
          [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 16])],
          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n", 16])])
    _save(root, "cast", helper.make_node("Cast", ["TEXT"], ["NUMBER"], to=TensorProto.INT64),
          [helper.make_tensor_value_info("TEXT", TensorProto.STRING, ["n", 1])],
          [helper.make_tensor_value_info("NUMBER", TensorProto.INT64, ["n", 1])])
    return root


def _post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> None:
    connection = http.client.HTTPConnection(servers.HOST, port, timeout=120)
    connection.request("POST", path, body, headers or {})
    connection.getresponse().read()
    connection.close()


def _cases(port: int, grpc_port: int) -> dict[str, Callable[[], object]]:
    x = np.random.default_rng(1).random((ROWS, 16), dtype=np.float32)
    json_body = orjson.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [ROWS, 16],
                                          "data": x.ravel().tolist()}]})
    texts = [str(i % 10).encode() for i in range(TEXTS)]
    raw = b"".join(len(t).to_bytes(4, "little") + t for t in texts)
    header = orjson.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [TEXTS, 1],
                                       "parameters": {"binary_data_size": len(raw)}}]})
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(
        f"{servers.HOST}:{grpc_port}", options=[("grpc.max_receive_message_length", 1 << 26)]))
    typed = service_pb2.ModelInferRequest(model_name="identity")
    typed.inputs.add(name="X", datatype="FP32", shape=[ROWS, 16]).contents.fp32_contents.extend(
        x.ravel().tolist())
    config = {"name": "identity", "max_batch_size": 0,
              "input": [{"name": f"in{i}", "data_type": "TYPE_FP32", "dims": [1, 2, 3]}
                        for i in range(3000)]}
    load = orjson.dumps({"parameters": {"config": orjson.dumps(config).decode()}})
    return {
        "REST JSON 1.6M numbers in and out": lambda: _post(
            port, "/v2/models/identity/infer", json_body),
        "REST binary 500k BYTES elements": lambda: _post(
            port, "/v2/models/cast/infer", header + raw,
            {"Inference-Header-Content-Length": str(len(header))}),
        "gRPC fp32_contents 1.6M floats": lambda: stub.ModelInfer(typed),
        "load with a 190 KB config (refused)": lambda: _post(
            port, "/v2/repository/models/identity/load", load),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="serval-stalls-"))
    repository = _repository(work / "repo")
    port, grpc_port = servers.free_ports(2)
    command = [*servers.serval_command(repository, port, 1, grpc_port),
               "--model-control", "explicit", "--load-model", "*"]
    with servers.running(command, port, "/v2/health/ready", work / "server.log"):
        cases = _cases(port, grpc_port)
        with LiveProbes(port) as probes:
            floor = statistics.median(
                probes.longest_during(lambda: time.sleep(0.2)) for _ in range(args.runs))
            print(f"{'request':40} {'longest probe wait (s)':>24}")
            print(f"{'none (the floor)':40} {floor:24.3f}")
            for name, action in cases.items():
                action()  # the first starts what it needs (the JSON helper process)
                waits = [probes.longest_during(action) for _ in range(args.runs)]
                print(f"{name:40} {statistics.median(waits):24.3f}")


if __name__ == "__main__":
    main()
