"""Attacks on the response cache (`--cache-config local,size=...`) of a real server: requests
whose keys are alike in every way but one, each of which must get its own answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests import triton_python_models
from tests.conftest import RunningServer
from tests.security.conftest import Factory

pytestmark = pytest.mark.integration

# Computes only the outputs asked for, as Triton's examples do with requested_output_names().
ONLY_ASKED = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            wanted = request.requested_output_names()
            made = {"SUM": x + 1, "DIFF": x - 1}
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(name, made[name]) for name in wanted]))
        return responses
'''

ONLY_ASKED_CONFIG = """\
backend: python
max_batch_size: 0
response_cache: true
inputs:
  - {name: INPUT0, datatype: FP32, dims: [4]}
outputs:
  - {name: SUM, datatype: FP32, dims: [4]}
  - {name: DIFF, datatype: FP32, dims: [4]}
"""


@pytest.fixture(scope="module")
def cache_server(server_factory: Factory, tmp_path_factory: pytest.TempPathFactory
                 ) -> RunningServer:
    root: Path = tmp_path_factory.mktemp("cache-keys")
    triton_python_models.write(root, "only_asked", ONLY_ASKED, ONLY_ASKED_CONFIG)
    return server_factory(root, "--cache-config", "local,size=1048576",
                          "--allow-python-models")


def _ask(client: httpclient.InferenceServerClient, x: np.ndarray, *names: str
         ) -> httpclient.InferResult:
    tensor = httpclient.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(x)
    outputs = [httpclient.InferRequestedOutput(name) for name in names]
    return client.infer("only_asked", [tensor], outputs=outputs)


def test_a_hit_for_outputs_the_stored_answer_lacks_runs_the_model(
        cache_server: RunningServer) -> None:
    """The first request stored SUM alone; the same inputs asking for DIFF must not be
    answered from it (a 500 for the missing output, before)."""
    client = httpclient.InferenceServerClient(cache_server.url)
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(_ask(client, x, "SUM").as_numpy("SUM"), x + 1)
    diff = _ask(client, x, "DIFF")
    np.testing.assert_array_equal(diff.as_numpy("DIFF"), x - 1)
    both = _ask(client, x, "SUM", "DIFF")
    np.testing.assert_array_equal(both.as_numpy("SUM"), x + 1)
    np.testing.assert_array_equal(both.as_numpy("DIFF"), x - 1)
    again = _ask(client, x, "SUM")  # still a hit once both are held
    np.testing.assert_array_equal(again.as_numpy("SUM"), x + 1)


def test_a_request_that_names_no_outputs_gets_them_all_after_a_partial_entry(
        cache_server: RunningServer) -> None:
    """No outputs named means every output: an entry holding SUM alone must not answer it."""
    client = httpclient.InferenceServerClient(cache_server.url)
    x = np.arange(4, dtype=np.float32) + 10
    np.testing.assert_array_equal(_ask(client, x, "SUM").as_numpy("SUM"), x + 1)
    every = _ask(client, x)
    assert sorted(o["name"] for o in every.get_response()["outputs"]) == ["DIFF", "SUM"]
    np.testing.assert_array_equal(every.as_numpy("DIFF"), x - 1)
