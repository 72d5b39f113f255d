"""Triton Python-backend models written as a Triton user writes them (model.py with
TritonPythonModel, `import triton_python_backend_utils as pb_utils`), for unit and
integration tests. Each builder writes <root>/<name>/config.yaml and <root>/<name>/1/model.py."""

from __future__ import annotations

from pathlib import Path

ADD_SUB = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.model_config = json.loads(args["model_config"])
        config = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT0")
        self.output0_dtype = pb_utils.triton_string_to_numpy(config["data_type"])
        self.batch_sizes = []

    def execute(self, requests):
        self.batch_sizes.append(len(requests))
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.output0_dtype))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.output0_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
'''

ADD_SUB_CONFIG = """\
backend: python
max_batch_size: 8
batching: {{max_queue_delay_ms: {delay_ms}}}
inputs:
  - {{name: INPUT0, datatype: {datatype}, dims: [16]}}
  - {{name: INPUT1, datatype: {datatype}, dims: [16]}}
outputs:
  - {{name: OUTPUT0, datatype: {datatype}, dims: [16]}}
  - {{name: OUTPUT1, datatype: {datatype}, dims: [16]}}
"""

# Triton's simple_string: strings of integers in, their sums and differences as strings out.
STRING = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            a = np.vectorize(lambda s: int(s or 0))(in0) if in0.size else in0
            b = np.vectorize(lambda s: int(s or 0))(in1) if in1.size else in1
            to_bytes = np.vectorize(lambda v: str(v).encode(), otypes=[np.object_])
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", to_bytes(a + b)),
                pb_utils.Tensor("OUTPUT1", to_bytes(a - b)),
            ]))
        return responses
'''

STRING_CONFIG = """\
backend: python
max_batch_size: 8
inputs:
  - {name: INPUT0, datatype: BYTES, dims: [16]}
  - {name: INPUT1, datatype: BYTES, dims: [16]}
outputs:
  - {name: OUTPUT0, datatype: BYTES, dims: [16]}
  - {name: OUTPUT1, datatype: BYTES, dims: [16]}
"""

# Fails the requests whose INPUT0 holds a negative value, each on its own; echoes what
# InferenceRequest says of itself (id, parameters, correlation id) as a JSON string.
CHECKED = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError("INPUT0 must not be negative",
                                             pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            seen = json.dumps({
                "id": request.request_id(),
                "parameters": json.loads(request.parameters()),
                "correlation_id": request.correlation_id(),
                "outputs": request.requested_output_names(),
            })
            rows = x.shape[0]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", x * 2),
                pb_utils.Tensor("SEEN", np.array([[seen.encode()]] * rows, dtype=np.object_)),
            ]))
        return responses
'''

CHECKED_CONFIG = """\
backend: python
max_batch_size: 8
batching: {max_queue_delay_ms: 100}
inputs:
  - {name: INPUT0, datatype: INT32, dims: [-1]}
outputs:
  - {name: OUTPUT0, datatype: INT32, dims: [-1]}
  - {name: SEEN, datatype: BYTES, dims: [1]}
"""

# Declared without inputs and outputs: auto_complete_config fills them in. initialize() keeps
# its args as the ARGS output; finalize() leaves a file beside the model's version folder.
AUTO = '''
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        auto_complete_model_config.add_input(
            {"name": "IN", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.add_output(
            {"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]})
        auto_complete_model_config.add_output(
            {"name": "ARGS", "data_type": "TYPE_STRING", "dims": [1]})
        return auto_complete_model_config

    def initialize(self, args):
        self.args = json.dumps(args).encode()
        self.folder = Path(args["model_repository"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            args = np.array([[self.args]] * x.shape[0], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", x + 1), pb_utils.Tensor("ARGS", args)]))
        return responses

    def finalize(self):
        (self.folder / "finalized").write_text("yes")
'''

AUTO_CONFIG = "backend: python\n"

# Made decoupled by auto_complete_config: two responses per request, the second final.
DECOUPLED = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_model_transaction_policy({"decoupled": True})
        config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [1]})
        config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]})
        return config

    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 3)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# Dies (as a segfault would) when INPUT0 holds 13; otherwise the identity.
CRASHER = '''
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x == 13).any():
                os._exit(3)
            pid = np.full((x.shape[0], 1), os.getpid(), dtype=np.int64)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("PID", pid)]))
        return responses
'''

CRASHER_CONFIG = """\
backend: python
max_batch_size: 8
inputs:
  - {name: INPUT0, datatype: INT32, dims: [-1]}
outputs:
  - {name: OUTPUT0, datatype: INT32, dims: [-1]}
  - {name: PID, datatype: INT64, dims: [1]}
"""


# OUT = X + BIAS, BIAS optional (0 when left out); WITH_BIAS says whether it was given.
OPTIONAL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            bias = pb_utils.get_input_tensor_by_name(request, "BIAS")
            total = x if bias is None else x + bias.as_numpy()
            given = np.full((x.shape[0], 1), bias is not None)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", total), pb_utils.Tensor("WITH_BIAS", given)]))
        return responses
'''

OPTIONAL_PBTXT = """\
name: "{name}"
backend: "python"
max_batch_size: 8
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
input [
  {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "BIAS" data_type: TYPE_FP32 dims: [ 4 ] optional: true }}
]
output [
  {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "WITH_BIAS" data_type: TYPE_BOOL dims: [ 1 ] }}
]
"""


def write(root: Path, name: str, source: str, config: str) -> Path:
    """A model folder: config.yaml and 1/model.py; returns the model folder."""
    version = root / name / "1"
    version.mkdir(parents=True)
    (root / name / "config.yaml").write_text(config)
    (version / "model.py").write_text(source)
    return root / name


def add_sub(root: Path, name: str = "add_sub", datatype: str = "INT32",
            delay_ms: float = 0.0) -> Path:
    return write(root, name, ADD_SUB,
                 ADD_SUB_CONFIG.format(datatype=datatype, delay_ms=delay_ms))


# Triton's examples/add_sub config.pbtxt, as a Triton user writes it
ADD_SUB_PBTXT = """\
name: "{name}"
backend: "python"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
instance_group [ {{ kind: KIND_CPU }} ]
"""


def write_pbtxt(root: Path, name: str, source: str, pbtxt: str) -> Path:
    """A model folder as Triton has it: config.pbtxt and 1/model.py."""
    version = root / name / "1"
    version.mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(pbtxt.format(name=name))
    (version / "model.py").write_text(source)
    return root / name


def build_all(root: Path) -> Path:
    """Every model above, as an integration test's repository."""
    add_sub(root, "add_sub")
    add_sub(root, "add_sub_fp32", "FP32")
    write(root, "simple_string", STRING, STRING_CONFIG)
    write(root, "checked", CHECKED, CHECKED_CONFIG)
    write(root, "auto", AUTO, AUTO_CONFIG)
    write(root, "crasher", CRASHER, CRASHER_CONFIG)
    write_pbtxt(root, "add_sub_pbtxt", ADD_SUB, ADD_SUB_PBTXT)
    return root
