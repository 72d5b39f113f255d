"""Triton ensembles whose steps do not agree with the ensemble's config, against a real
server: steps that disagree on a datatype with each other or with the ensemble's declared
inputs and outputs are refused at load (503 with the reason), as Triton refuses them; never a
200 whose datatype the ensemble's metadata does not give."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import RunningServer
from tests.integration.http_helpers import infer
from tests.triton_python_models import write

pytestmark = pytest.mark.integration
Factory = Callable[..., RunningServer]

STEP_CONFIG = """\
backend: python
max_batch_size: 8
inputs: [{{name: X, datatype: FP32, dims: [-1]}}]
outputs: [{{name: Y, datatype: {out}, dims: [-1]}}]
"""

STEP = """
import numpy as np


class Model:
    def load(self, ctx):
        pass

    def infer(self, inputs):
        return {{"Y": (inputs["X"] * 2).astype(np.{dtype})}}
"""

ENSEMBLE = """\
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
ensemble_scheduling {{ step [
  {{ model_name: "{first}" model_version: -1
     input_map {{ key: "X" value: "IN" }} output_map {{ key: "Y" value: "mid" }} }},
  {{ model_name: "{last}" model_version: -1
     input_map {{ key: "X" value: "mid" }} output_map {{ key: "Y" value: "OUT" }} }}
] }}
"""


def _ensemble(root: Path, name: str, last: str, first: str = "double") -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(ENSEMBLE.format(name=name, first=first,
                                                              last=last))


@pytest.fixture(scope="module")
def server(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    root: Path = tmp_path_factory.mktemp("ensembles")
    write(root, "double", STEP.format(dtype="float32"), STEP_CONFIG.format(out="FP32"))
    write(root, "to_int", STEP.format(dtype="int32"), STEP_CONFIG.format(out="INT32"))
    _ensemble(root, "chain", "double")
    _ensemble(root, "int_out", "to_int")
    _ensemble(root, "int_into_float", "double", first="to_int")
    _ensemble(root, "int_in", "double")
    config = root / "int_in" / "config.pbtxt"
    config.write_text(config.read_text().replace(
        'input [ { name: "IN" data_type: TYPE_FP32', 'input [ { name: "IN" data_type: TYPE_INT32'))
    return server_factory(root, "--allow-python-models")


IN = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}]}


def test_a_chain_whose_steps_agree_answers(server: RunningServer) -> None:
    reply = infer(server.url, "chain", IN)
    assert reply.status == 200, reply.body
    assert reply.json()["outputs"][0] == {"name": "OUT", "datatype": "FP32", "shape": [1, 2],
                                          "data": [4.0, 8.0]}


def test_a_step_output_of_another_datatype_than_declared_is_refused_at_load(
        server: RunningServer) -> None:
    """Before: it loaded, and every request was a 500 (the output checked per answer)."""
    reply = infer(server.url, "int_out", IN)
    assert reply.status == 503, reply.body
    assert ("load failed: pipeline 'int_out' step 2 ('to_int') makes pipeline output 'OUT' as "
            "INT32 (its output 'Y'), but the pipeline's config declares it FP32") in reply.error


def test_an_ensemble_input_declared_in_another_datatype_than_its_step_takes_is_refused(
        server: RunningServer) -> None:
    """The ensemble declares IN as INT32, its first step takes it as FP32: before, it loaded
    and every request failed at the step."""
    reply = infer(server.url, "int_in", {"inputs": [
        {"name": "IN", "datatype": "INT32", "shape": [1, 2], "data": [1, 2]}]})
    assert reply.status == 503, reply.body
    assert ("load failed: pipeline 'int_in' step 1 ('double') takes 'IN' as input 'X' of FP32, "
            "but the pipeline's config declares it INT32") in reply.error


def test_a_step_taking_a_tensor_in_another_datatype_than_made_is_refused_at_load(
        server: RunningServer) -> None:
    """Step 1 makes 'mid' INT32, step 2 takes it as FP32: Triton refuses such an ensemble at
    load; the old code loaded it and failed each request with a 500."""
    reply = infer(server.url, "int_into_float", IN)
    assert reply.status == 503, reply.body
    assert ("load failed: pipeline 'int_into_float' step 2 ('double') takes 'mid' as input "
            "'X' of FP32, but step 1 ('to_int') makes it INT32") in reply.error
