"""instance_group count N of a model in worker processes (Triton Python-backend models, and
`isolation: process` Serval models): N processes serving N batches at once, against a real
server with tritonclient. Before, every count ran in one process, its batches one after
another: a model that holds the GIL served no faster with count 4 than with 1."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import RunningServer
from tests.triton_python_models import write_pbtxt

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]

# Each execute() signs in under its process id in a shared folder, then waits (up to 20 s) until
# as many processes as the request asks for have signed in, and answers how many it saw and
# its own pid. Processes that run one batch at a time can never see each other.
RENDEZVOUS = '''
import os
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

FOLDER = Path({folder!r})


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            wanted = int(pb_utils.get_input_tensor_by_name(request, "WANT").as_numpy()[0])
            (FOLDER / str(os.getpid())).touch()
            deadline = time.monotonic() + 20
            while len(list(FOLDER.iterdir())) < wanted and time.monotonic() < deadline:
                time.sleep(0.01)
            seen = len(list(FOLDER.iterdir()))
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SEEN", np.array([seen], np.int32)),
                pb_utils.Tensor("PID", np.array([os.getpid()], np.int32))]))
        return responses
'''

CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "WANT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
output [
  {{ name: "SEEN", data_type: TYPE_INT32, dims: [ 1 ] }},
  {{ name: "PID", data_type: TYPE_INT32, dims: [ 1 ] }}
]
instance_group [ {{ count: 3, kind: KIND_CPU }} ]
"""


# Answers which instance ran it (Triton names them <model>_0_0, <model>_0_1, ...); instance 1
# aborts on a negative input, instance 0 answers it.
ONE_CRASHES = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.index = int(args["model_instance_name"].rsplit("_", 1)[1])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if self.index == 1 and (x < 0).any():
                os.abort()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("INSTANCE", np.array([self.index], np.int32))]))
        return responses
'''

ONE_CRASHES_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "INSTANCE", data_type: TYPE_INT32, dims: [ 1 ] }} ]
instance_group [ {{ count: 2, kind: KIND_CPU }} ]
"""


@pytest.fixture(scope="module")
def served(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[RunningServer, Path]:
    root = tmp_path_factory.mktemp("python-instances")
    folders = tmp_path_factory.mktemp("rendezvous")
    (folders / "three").mkdir()
    write_pbtxt(root, "three", RENDEZVOUS.format(folder=str(folders / "three")), CONFIG)
    write_pbtxt(root, "one_crashes", ONE_CRASHES, ONE_CRASHES_CONFIG)
    return server_factory(root, "--allow-python-models", "--repository-api"), folders


def _ask(url: str, model: str, wanted: int) -> tuple[int, int]:
    client = httpclient.InferenceServerClient(url, network_timeout=60.0)
    tensor = httpclient.InferInput("WANT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([wanted], np.int32))
    result = client.infer(model, [tensor])
    return int(result.as_numpy("SEEN")[0]), int(result.as_numpy("PID")[0])


def _rendezvous(server: RunningServer, folder: Path) -> list[tuple[int, int]]:
    """Three requests at once, each waiting for three processes to sign in."""
    for stale in folder.iterdir():
        stale.unlink()
    with ThreadPoolExecutor(3) as pool:
        return list(pool.map(lambda _: _ask(server.url, "three", 3), range(3)))


def test_three_instances_run_three_batches_at_once_in_three_processes(
        served: tuple[RunningServer, Path]) -> None:
    server, folders = served
    answers = _rendezvous(server, folders / "three")
    assert [seen for seen, _ in answers] == [3, 3, 3], answers
    assert len({pid for _, pid in answers}) == 3


def test_a_killed_instance_fails_only_its_batch_and_comes_back(
        served: tuple[RunningServer, Path]) -> None:
    server, folders = served
    pids = {pid for _, pid in _rendezvous(server, folders / "three")}
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    _wait_gone({victim})
    failures = []
    for _ in range(3):  # each request takes the free instance first in line: all three
        try:
            _ask(server.url, "three", 1)
        except InferenceServerException as exc:
            failures.append(str(exc))
    assert len(failures) == 1 and "worker process died (killed by SIGKILL)" in failures[0]
    answers = _rendezvous(server, folders / "three")  # the restarted one signs in too
    assert [seen for seen, _ in answers] == [3, 3, 3], answers
    after = {pid for _, pid in answers}
    assert victim not in after and len(after & pids) == 2


def test_unloading_stops_every_instance_process(served: tuple[RunningServer, Path]) -> None:
    server, folders = served
    pids = {pid for _, pid in _rendezvous(server, folders / "three")}
    assert len(pids) == 3
    client = httpclient.InferenceServerClient(server.url, network_timeout=60.0)
    client.unload_model("three")
    _wait_gone(pids)
    client.load_model("three")
    assert [seen for seen, _ in _rendezvous(server, folders / "three")] == [3, 3, 3]


def _instance(url: str, x: float) -> int:
    client = httpclient.InferenceServerClient(url, network_timeout=60.0)
    tensor = httpclient.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.array([x], np.float32))
    return int(client.infer("one_crashes", [tensor]).as_numpy("INSTANCE")[0])


def test_instances_are_named_as_triton_names_them(served: tuple[RunningServer, Path]) -> None:
    server, _ = served
    assert {_instance(server.url, 1.0) for _ in range(4)} == {0, 1}


def test_batches_go_to_the_instance_that_is_up_not_the_one_its_crash_loop_holds(
        served: tuple[RunningServer, Path]) -> None:
    """Instance 1 crashed 6 times in a row: its restart waits 4 s (1 s, then 2 s, before).
    Meanwhile every request goes to instance 0 (before, every other request got instance 1's
    503). Four requests take milliseconds: 4 s leaves a loaded box a wide margin, and no
    clock is read to judge the answer."""
    server, _ = served
    crashes: list[str] = []
    deadline = time.monotonic() + 60
    while len(crashes) < 6:  # a negative input crashes instance 1 only (0 answers it)
        assert time.monotonic() < deadline, crashes
        try:
            _instance(server.url, -1.0)
        except InferenceServerException as exc:
            crashes.append(str(exc))
    assert "has crashed 6 times in a row and restarts in 4.0 s" in crashes[-1], crashes
    assert [_instance(server.url, 1.0) for _ in range(4)] == [0, 0, 0, 0]
    deadline = time.monotonic() + 30
    while _instance(server.url, 1.0) != 1:  # it comes back after its hold
        assert time.monotonic() < deadline
    assert "restarting it" in server.log()


def _wait_gone(pids: set[int]) -> None:
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if _alive(p)]}"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
