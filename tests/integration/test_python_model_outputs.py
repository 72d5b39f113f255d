"""A Serval Python model (`class Model`) whose infer() returns an output other than its config
declares, against a real server: refused (500 naming the output and the declared datatype),
never served to clients as a datatype its metadata does not give, in process or in a worker."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import RunningServer
from tests.integration.http_helpers import infer
from tests.triton_python_models import write

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]

CONFIG = """\
backend: python
max_batch_size: 4
inputs: [{name: X, datatype: FP32, dims: [2]}]
outputs: [{name: Y, datatype: FP32, dims: [2]}]
"""

# the input's first value picks what infer() returns for Y
MODEL = """
import numpy as np


class Model:
    def load(self, ctx):
        pass

    def infer(self, inputs):
        x = inputs["X"]
        kind = int(x[0, 0])
        if kind == 1:
            return {"Y": x.astype(np.float64)}
        if kind == 2:
            return {"Y": x.tolist()}
        if kind == 3:
            return {"Y": np.zeros(x.shape, np.uint8)}
        return {"Y": x}
"""


# fills a buffer of its own and returns a view of it (numpy code that saves allocations)
REUSES_BUFFER = """
import numpy as np


class Model:
    def load(self, ctx):
        self.buffer = np.zeros((4, 2), np.float32)

    def infer(self, inputs):
        rows = inputs["X"].shape[0]
        self.buffer[:rows] = inputs["X"]
        return {"Y": self.buffer[:rows]}
"""


# keeps its work on self, as a model written for one batch at a time does (Triton's
# instance_group gives each instance an object of its own)
STATE_ON_SELF = """
import time

import numpy as np


class Model:
    def load(self, ctx):
        self.buffer = np.zeros((4, 2), np.float32)

    def infer(self, inputs):
        rows = inputs["X"].shape[0]
        self.buffer[:rows] = inputs["X"]
        time.sleep(0.002)  # work between filling and reading it
        return {"Y": self.buffer[:rows].copy()}
"""


@pytest.fixture(scope="module")
def server(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root: Path = tmp_path_factory.mktemp("python-outputs")
    write(root, "inproc", MODEL, CONFIG)
    write(root, "worker", MODEL, CONFIG + "isolation: process\n")
    write(root, "buffer", REUSES_BUFFER, CONFIG)
    write(root, "two_instances", STATE_ON_SELF, CONFIG + "instances: 2\n")
    return server_factory(root, "--allow-python-models")


@pytest.mark.parametrize("model", ["inproc", "worker"])
@pytest.mark.parametrize(("kind", "got"), [(2, "list"), (3, "UINT8 array")])
def test_an_output_of_another_datatype_is_refused_not_served(
        server: RunningServer, model: str, kind: int, got: str) -> None:
    reply = infer(server.url, model, {"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [float(kind), 2.0]}]})
    assert reply.status == 500, reply.body
    assert f"output 'Y' as a {got}; its config says a numpy array of FP32" in server.log()
    ok = infer(server.url, model, {"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [0.0, 2.0]}]})
    assert ok.status == 200, ok.body
    assert ok.json()["outputs"][0]["datatype"] == "FP32"


@pytest.mark.parametrize("model", ["buffer", "two_instances"])
def test_a_model_reusing_its_output_buffer_answers_each_request_its_own_rows(
        server: RunningServer, model: str) -> None:
    def tagged(tag: int) -> bool:
        reply = infer(server.url, model, {"inputs": [
            {"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [float(tag)] * 2}]})
        assert reply.status == 200, reply.body
        return bool(reply.json()["outputs"][0]["data"] == [float(tag)] * 2)

    with ThreadPoolExecutor(8) as pool:  # the next batch runs while one's answer is encoded
        answers = list(pool.map(tagged, range(400)))
    assert answers.count(False) == 0, f"{answers.count(False)} of 400 got another's rows"


@pytest.mark.parametrize("model", ["inproc", "worker"])
def test_a_float_output_of_another_width_is_served_in_the_declared_one(
        server: RunningServer, model: str) -> None:
    """FP64 (numpy's default for Python numbers) where FP32 is declared: cast, as a float
    program's output is (a float of another width is the same values, not another type)."""
    reply = infer(server.url, model, {"inputs": [
        {"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.5]}]})
    assert reply.status == 200, reply.body
    [output] = reply.json()["outputs"]
    assert (output["datatype"], output["data"]) == ("FP32", [1.0, 2.5])
