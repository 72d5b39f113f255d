"""A Python model's faults in its worker process against a real server: an execute() that
raises what cannot be printed, sys.exit() or KeyboardInterrupt, or outputs that cannot cross
the pipe, fails its own requests (500, the model's error named) and the worker goes on, the
same process answering next: no restart, and a batch-mate's answer still arrives."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import RunningServer
from tests.integration.http_helpers import Reply, call, infer
from tests.integration.stream_helpers import stream_responses
from tests.triton_python_models import write, write_pbtxt

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]

# max_batch_size 2 and a long delay: two single-row requests always run as one batch
CONFIG = """\
backend: python
max_batch_size: 2
batching: {max_queue_delay_ms: 10000}
inputs: [{name: INPUT0, datatype: FP32, dims: [1]}]
outputs: [{name: OUTPUT0, datatype: BYTES, dims: [1]}]
"""

# the input picks the fault; 0 answers the worker's pid
FAULTS = '''
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no text")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            mode = int(x[0, 0])
            if mode == 1:
                raise Unprintable()
            if mode == 2:
                sys.exit(3)
            if mode == 3:
                raise KeyboardInterrupt
            value = (lambda: 0) if mode == 4 else str(os.getpid()).encode()
            output = np.array([[value]] * x.shape[0], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", output)]))
        return responses
'''

# a Serval model in a worker process (isolation: process): the batch path
ISOLATED = '''
import os

import numpy as np


class Model:
    def load(self, ctx):
        pass

    def infer(self, inputs):
        rows = inputs["INPUT0"].shape[0]
        value = (lambda: 0) if inputs["INPUT0"][0, 0] == 4 else str(os.getpid()).encode()
        return {"OUTPUT0": np.array([[value]] * rows, dtype=np.object_)}
'''


# initialize() leaves a thread running (not a daemon: the worker's exit would wait for it) and
# fails: the load must end all the same
THREAD_THEN_FAIL = '''
import os
import threading
import time
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        (Path(args["model_repository"]) / "worker.pid").write_text(str(os.getpid()))
        threading.Thread(target=time.sleep, args=(100000,)).start()
        raise RuntimeError("cannot initialize")

    def execute(self, requests):
        return []
'''


# decoupled: an answer pickle refuses, then a good one, then the end
STREAMS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for value in ((lambda: 0), b"after"):
                output = pb_utils.Tensor("OUTPUT0", np.array([[value]], dtype=np.object_))
                sender.send(pb_utils.InferenceResponse([output]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
# decoupled: sys.exit() in execute() on a 1, else one answer
STREAM_EXITS = '''
import sys

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x[0, 0] == 1:
                sys.exit(3)
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.astype(bytes))]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
STREAM_PBTXT = """\
name: "{name}"
backend: "python"
max_batch_size: 1
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] }} ]
model_transaction_policy {{ decoupled: true }}
"""


@pytest.fixture(scope="module")
def server(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root: Path = tmp_path_factory.mktemp("worker-faults")
    write(root, "faults", FAULTS, CONFIG)
    write_pbtxt(root, "streams", STREAMS, STREAM_PBTXT)
    write_pbtxt(root, "stream_exits", STREAM_EXITS, STREAM_PBTXT)
    write(root, "isolated", ISOLATED, CONFIG.replace("max_batch_size: 2",
                                                     "max_batch_size: 1\nisolation: process"))
    return server_factory(root, "--allow-python-models")


def _run(server: RunningServer, model: str, mode: int, rows: int = 1) -> Reply:
    return infer(server.url, model, {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [rows, 1], "data": [float(mode)] * rows}]})


def _pid(server: RunningServer, model: str) -> str:
    """The worker's pid, from a request that fills a batch alone (no wait for a batch-mate)."""
    reply = _run(server, model, 0, rows=2 if model == "faults" else 1)
    assert reply.status == 200, reply.body
    return str(reply.json()["outputs"][0]["data"][0])


@pytest.mark.parametrize(("mode", "named"), [
    (1, "Unprintable"), (2, "SystemExit(3)"), (3, "KeyboardInterrupt")])
def test_what_execute_raises_fails_its_batch_and_the_worker_goes_on(
        server: RunningServer, mode: int, named: str) -> None:
    pid = _pid(server, "faults")
    with ThreadPoolExecutor(2) as pool:  # one batch of two: both fail (execute raised)
        replies = list(pool.map(lambda m: _run(server, "faults", m), (mode, 0)))
    for reply in replies:
        assert reply.status == 500, reply.body
        assert "worker process died" not in reply.error
    assert named in server.log()
    assert _pid(server, "faults") == pid  # the same worker: no restart


def test_an_output_that_cannot_be_sent_fails_only_its_request(server: RunningServer) -> None:
    pid = _pid(server, "faults")
    with ThreadPoolExecutor(2) as pool:
        bad = pool.submit(_run, server, "faults", 4)
        good = pool.submit(_run, server, "faults", 0)
        bad_reply, good_reply = bad.result(timeout=60), good.result(timeout=60)
    assert good_reply.status == 200, good_reply.body
    assert good_reply.json()["outputs"][0]["data"] == [pid]
    assert bad_reply.status == 500, bad_reply.body
    assert "worker process died" not in bad_reply.error
    assert "OUTPUT0' cannot be sent" in server.log()
    assert _pid(server, "faults") == pid


def test_an_isolated_models_unsendable_output_leaves_its_worker_running(
        server: RunningServer) -> None:
    pid = _pid(server, "isolated")
    reply = _run(server, "isolated", 4)
    assert reply.status == 500, reply.body
    assert "worker process died" not in reply.error
    assert _pid(server, "isolated") == pid


def test_a_failed_initialize_that_left_a_thread_running_ends_its_load(
        server_factory: Factory, tmp_path: Path) -> None:
    folder = write(tmp_path, "stuck", THREAD_THEN_FAIL, CONFIG)
    server = server_factory(tmp_path, "--allow-python-models", "--model-control", "explicit")
    for _ in range(2):  # a second load too: the first left nothing behind holding the model
        reply = call(server.url, "POST", "/v2/repository/models/stuck/load")
        assert reply.status == 400, reply.body
        assert "cannot initialize" in reply.error
        pid = int((folder / "worker.pid").read_text())
        assert not Path(f"/proc/{pid}").exists()  # reaped before the load answered


def test_a_streamed_answer_that_cannot_be_sent_is_an_error_and_the_stream_goes_on(
        server: RunningServer) -> None:
    x = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), np.float32))
    for _ in range(2):  # the same worker serves the next request as well
        first, second = stream_responses(server.grpc_url, "streams", [x], 2)
        assert isinstance(first, InferenceServerException), first
        assert "the model failed to run the request" in str(first.message())
        assert second.as_numpy("OUTPUT0").tolist() == [[b"after"]]


def test_sys_exit_in_a_decoupled_execute_fails_its_request_not_the_model(
        server: RunningServer) -> None:
    def first_answer(value: float) -> Any:
        x = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
        x.set_data_from_numpy(np.full((1, 1), value, np.float32))
        return stream_responses(server.grpc_url, "stream_exits", [x], 1, timeout_s=20)[0]

    failed = first_answer(1.0)
    assert isinstance(failed, InferenceServerException), failed
    assert first_answer(0.0).as_numpy("OUTPUT0").tolist() == [[b"0.0"]]
