"""Careless Triton Python models against a real server: what their code does wrong (a hanging
finalize(), a subprocess never waited for, a cycle of BLS calls, sys.exit() in initialize())
stays with them; the server, its other models and the host go on."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import Reply, call, infer, wait_until_idle, wait_until_running
from tests.triton_python_models import write, write_pbtxt

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]

CONFIG = """\
backend: python
max_batch_size: 8
inputs: [{name: INPUT0, datatype: FP32, dims: [-1]}]
outputs: [{name: OUTPUT0, datatype: FP32, dims: [-1]}]
"""

# initialize() writes the worker's pid (and its subprocess's) beside the version folder
HEAD = '''
import os
import subprocess
import sys
import time
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = Path(args["model_repository"])
        (self.folder / "worker.pid").write_text(str(os.getpid()))
        self.setup()

    def setup(self):
        pass

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", self.run(x))]))
        return responses

    def run(self, x):
        return x.as_numpy()
'''

STUCK_FINALIZE = HEAD + '''
    def finalize(self):
        (self.folder / "finalizing").write_text("yes")
        time.sleep(100000)
'''

SPAWNS = HEAD + '''
    def setup(self):
        self.child = subprocess.Popen(["sleep", "100000"])
        (self.folder / "child.pid").write_text(str(self.child.pid))
'''

EXITS = HEAD + '''
    def setup(self):
        sys.exit(2)
'''

# calls OTHER with its input, and answers its output (or the call's error, as its own)
CALLS = HEAD + '''
    def run(self, x):
        reply = pb_utils.InferenceRequest(model_name="{other}", inputs=[x],
                                          requested_output_names=["OUTPUT0"]).exec()
        if reply.has_error():
            raise pb_utils.TritonModelException(reply.error().message())
        return pb_utils.get_output_tensor_by_name(reply, "OUTPUT0").as_numpy()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            try:
                outputs = [pb_utils.Tensor("OUTPUT0", self.run(x))]
                responses.append(pb_utils.InferenceResponse(outputs))
            except pb_utils.TritonModelException as exc:
                error = pb_utils.TritonError(str(exc))
                responses.append(pb_utils.InferenceResponse([], error=error))
        return responses
'''

# execute() waits until the test writes the file `release` beside its version folder
WAITS = HEAD + """
    def run(self, x):
        while not (self.folder / "release").exists():
            time.sleep(0.05)
        return x.as_numpy()
"""

# execute() leaves a thread calling `echo` over BLS as it returns (Triton's rule: calls end
# within execute()); the calls and the answer are big enough to fill the pipe
LATE_CALLS = HEAD.replace("import time", "import threading\nimport time\nimport numpy as np") + """
    def run(self, x):
        threading.Thread(target=self.calls, daemon=True).start()
        return np.ones((x.as_numpy().shape[0], 1 << 20), np.float32)

    def calls(self):
        big = pb_utils.Tensor("INPUT0", np.ones((1, 1 << 20), np.float32))
        for _ in range(3):
            pb_utils.InferenceRequest(model_name="echo", inputs=[big],
                                      requested_output_names=["OUTPUT0"]).exec()
"""

X = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}
ADD_SUB = {"inputs": [{"name": name, "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}
                      for name in ("INPUT0", "INPUT1")]}


def _serve(server_factory: Factory, root: Path) -> RunningServer:
    fixture_models.add_sub(root)
    return server_factory(root, "--allow-python-models", "--model-control", "explicit",
                          "--load-model", "add_sub")


def _load(server: RunningServer, model: str) -> Reply:
    return call(server.url, "POST", f"/v2/repository/models/{model}/load")


def _unload(server: RunningServer, model: str) -> Reply:
    return call(server.url, "POST", f"/v2/repository/models/{model}/unload")


def _running(pid: int) -> bool:
    """Whether the process runs (a zombie left for init to reap has stopped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_finalize_that_hangs_does_not_stall_the_server(server_factory: Factory,
                                                        tmp_path: Path) -> None:
    folder = write(tmp_path, "stuck", STUCK_FINALIZE, CONFIG)
    server = _serve(server_factory, tmp_path)
    assert _load(server, "stuck").status == 200
    worker = int((folder / "worker.pid").read_text())
    unloading = threading.Thread(target=_unload, args=(server, "stuck"))
    unloading.start()
    _wait_for((folder / "finalizing").exists, "finalize() did not run on unload")
    assert infer(server.url, "add_sub", ADD_SUB).status == 200
    assert _running(worker), "another model was answered only once the worker was killed"
    unloading.join(timeout=30)
    _wait_for(lambda: not _running(worker), "the hanging worker was never killed")


def test_what_a_model_spawns_goes_with_it_at_unload(server_factory: Factory,
                                                     tmp_path: Path) -> None:
    folder = write(tmp_path, "spawns", SPAWNS, CONFIG)
    server = _serve(server_factory, tmp_path)
    assert _load(server, "spawns").status == 200
    child = int((folder / "child.pid").read_text())
    assert _running(child)
    assert _unload(server, "spawns").status == 200
    _wait_for(lambda: not _running(child), "the model's subprocess outlived its unload")


def test_a_worker_does_not_outlive_a_killed_server(server_factory: Factory,
                                                   tmp_path: Path) -> None:
    folder = write(tmp_path, "spawns", SPAWNS, CONFIG)
    server = _serve(server_factory, tmp_path)
    assert _load(server, "spawns").status == 200
    worker = int((folder / "worker.pid").read_text())
    child = int((folder / "child.pid").read_text())
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait(timeout=30)
    _wait_for(lambda: not _running(worker), "the worker outlived its server")
    _wait_for(lambda: not _running(child), "the model's subprocess outlived its server")


def test_a_cycle_of_bls_calls_is_refused_not_wedged(server_factory: Factory,
                                                    tmp_path: Path) -> None:
    write(tmp_path, "ping", CALLS.replace("{other}", "pong"), CONFIG)
    write(tmp_path, "pong", CALLS.replace("{other}", "ping"), CONFIG)
    server = _serve(server_factory, tmp_path)
    assert _load(server, "ping").status == 200 and _load(server, "pong").status == 200
    for model, other in (("ping", "pong"), ("pong", "ping"), ("ping", "pong")):
        reply = infer(server.url, model, X)
        assert reply.status == 400, reply.body
        assert (f"model '{model}' is waiting on this call already (it called '{other}'"
                in reply.error)
    assert _unload(server, "ping").status == 200


# streams from a decoupled model with exec(decoupled=True); the decoupled model answers each
# request with what `run` (CALLS's: a plain call back) gives, as one final response
PLAIN_CALL = """        reply = pb_utils.InferenceRequest(model_name="{other}", inputs=[x],
                                          requested_output_names=["OUTPUT0"]).exec()
        if reply.has_error():"""
STREAMS = CALLS.replace(PLAIN_CALL, """        for reply in pb_utils.InferenceRequest(
                model_name="{other}", inputs=[x],
                requested_output_names=["OUTPUT0"]).exec(decoupled=True):
            if reply.has_error() or reply.output_tensors():
                break
        if reply.has_error():""")
DECOUPLED_PBTXT = """\
name: "{name}"
backend: "python"
max_batch_size: 8
model_transaction_policy {{ decoupled: true }}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""


def test_a_cycle_through_a_streamed_call_is_refused_not_wedged(server_factory: Factory,
                                                               tmp_path: Path) -> None:
    """ping streams from the decoupled pong, which calls ping back: refused like a plain
    cycle (the streamed call's request carries the models waiting on it too)."""
    write(tmp_path, "ping", STREAMS.replace("{other}", "pong"), CONFIG)
    write_pbtxt(tmp_path, "pong", CALLS.replace("{other}", "ping").replace(
        "    def execute(self, requests):", "    def execute_calls(self, requests):") + '''
    def execute(self, requests):  # decoupled: each answer goes through the request's sender
        for request, response in zip(requests, self.execute_calls(requests)):
            request.get_response_sender().send(
                response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
''', DECOUPLED_PBTXT)
    server = _serve(server_factory, tmp_path)
    assert _load(server, "ping").status == 200 and _load(server, "pong").status == 200
    reply = infer(server.url, "ping", {**X, "parameters": {"timeout": 20_000_000}})
    assert reply.status == 400, reply.body
    assert "model 'ping' is waiting on this call already (it called 'pong'" in reply.error


def test_a_client_cannot_make_a_models_bls_calls_look_like_a_cycle(server_factory: Factory,
                                                                   tmp_path: Path) -> None:
    """The models waiting on a call travel beside the request, not in its parameters: a
    client's parameter of the old name is an ordinary parameter, and the batch it joins
    (other clients' requests included) still calls the model it names."""
    write(tmp_path, "ping", CALLS.replace("{other}", "echo"), CONFIG)
    write(tmp_path, "echo", HEAD, CONFIG)
    server = _serve(server_factory, tmp_path)
    assert _load(server, "echo").status == 200 and _load(server, "ping").status == 200
    forged = {**X, "parameters": {"serval_bls_chain": '["echo"]'}}
    reply = infer(server.url, "ping", forged)
    assert reply.status == 200, reply.body
    assert orjson.loads(reply.body)["outputs"][0]["data"] == [1.0, 2.0]


def test_a_cycle_through_a_pipeline_is_refused_not_wedged(server_factory: Factory,
                                                          tmp_path: Path) -> None:
    write(tmp_path, "ping", CALLS.replace("{other}", "loop"), CONFIG)
    (tmp_path / "loop" / "1").mkdir(parents=True)
    (tmp_path / "loop" / "config.yaml").write_text(
        "backend: pipeline\nmax_batch_size: 8\n"
        "inputs: [{name: INPUT0, datatype: FP32, dims: [-1]}]\n"
        "outputs: [{name: OUTPUT0, datatype: FP32, dims: [-1]}]\n"
        "steps: [{model: ping, inputs: {INPUT0: INPUT0}, outputs: {OUTPUT0: OUTPUT0}}]\n")
    server = _serve(server_factory, tmp_path)
    assert _load(server, "ping").status == 200 and _load(server, "loop").status == 200
    for model in ("ping", "loop", "ping"):
        reply = infer(server.url, model, X)
        assert reply.status == 400, reply.body
        assert ("pipeline 'loop' step 1 calls model 'ping', which is waiting on this request "
                "already" in reply.error), reply.error
    assert _unload(server, "ping").status == 200


def test_sys_exit_in_initialize_is_a_load_error_naming_it(server_factory: Factory,
                                                          tmp_path: Path) -> None:
    write(tmp_path, "exits", EXITS, CONFIG)
    server = _serve(server_factory, tmp_path)
    reply = _load(server, "exits")
    assert reply.status == 400
    assert "initialize() failed: SystemExit(2)" in reply.error, reply.error
    assert infer(server.url, "add_sub", ADD_SUB).status == 200


def test_a_bls_call_gives_up_at_its_timeout_when_the_called_model_hangs(
        server_factory: Factory, tmp_path: Path) -> None:
    folder = write(tmp_path, "waits", WAITS, CONFIG)
    write(tmp_path, "caller", CALLS.replace("{other}", "waits").replace(
        'requested_output_names=["OUTPUT0"])', 'requested_output_names=["OUTPUT0"], '
        "timeout=300000)"), CONFIG)
    server = _serve(server_factory, tmp_path)
    assert _load(server, "waits").status == 200 and _load(server, "caller").status == 200
    try:
        reply = infer(server.url, "caller", X)
        assert reply.status == 400, reply.body
        assert "model 'waits' did not answer within the call's timeout (300000 us)" \
            in reply.error
    finally:
        (folder / "release").write_text("go")
    wait_until_idle(server.url, "waits")  # its one batch, measured at over 300 ms, has ended
    reply = infer(server.url, "caller", X)
    assert reply.status == 200, reply.body  # neither model is left wedged or refused for ever


def test_bls_calls_from_a_thread_after_execute_returned_do_not_corrupt_the_pipe(
        server_factory: Factory, tmp_path: Path) -> None:
    write(tmp_path, "late", LATE_CALLS, CONFIG)
    write(tmp_path, "echo", HEAD, CONFIG)
    server = _serve(server_factory, tmp_path)
    assert _load(server, "echo").status == 200 and _load(server, "late").status == 200
    binary = {**X, "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
    for _ in range(6):  # each answered (a reply cut by a call's bytes wedged the model)
        reply = infer(server.url, "late", binary)
        assert reply.status == 200, reply.body[:200]
        assert len(reply.body) > 4 << 20


def test_a_model_that_hangs_holds_up_neither_queued_deadlines_nor_shutdown(
        server_factory: Factory, tmp_path: Path) -> None:
    """execute() never returns (WAITS, never released). A request queued behind it with a
    deadline gets its 504 at that deadline; SIGTERM ends the server after --exit-timeout-s
    (before: the queued request waited for ever, and so did the shutdown, on the drain and
    then on the worker's pipe lock); the worker goes with it."""
    folder = write(tmp_path, "hangs", WAITS, CONFIG)
    fixture_models.add_sub(tmp_path)
    server = server_factory(tmp_path, "--allow-python-models", "--exit-timeout-s", "2")
    worker = int((folder / "worker.pid").read_text())
    def never_answered() -> None:
        with contextlib.suppress(OSError):  # the server goes without answering it
            infer(server.url, "hangs", X)

    stuck = threading.Thread(target=never_answered, daemon=True)
    stuck.start()
    wait_until_running(server.url, "hangs")
    late = call(server.url, "POST", "/v2/models/hangs/infer", orjson.dumps(X),
                {"Serval-Timeout-Ms": "300"})
    assert late.status == 504 and "deadline" in late.error
    assert infer(server.url, "add_sub", ADD_SUB).status == 200  # the others go on
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=60)
    _wait_for(lambda: not _running(worker), "the hung worker outlived its server")
