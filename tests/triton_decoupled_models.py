"""Decoupled Triton Python-backend models (model_transaction_policy { decoupled: true }) as a
Triton user writes them: config.pbtxt and 1/model.py, responses sent through each request's
response sender, from execute() or from threads it starts.

- repeat_int32: Triton's repeat example (inputs IN INT32 [-1], DELAY UINT32 [-1], WAIT UINT32
  [1]; outputs OUT INT32 [1], IDX UINT32 [1]): one response per element of IN, the i-th after
  DELAY[i] ms, sent from a thread; execute() returns after WAIT ms; IN of shape [0] sends none.
- square_int32: Triton python_backend's square example: IN INT32 [1] = n, n responses OUT = n.
- modes: what a test asks by MODE (see MODES), N its count.
- counter: Serval's own decoupled model (config.yaml, a `Model` whose infer is a generator).
"""

from __future__ import annotations

from pathlib import Path

from tests.triton_python_models import write as write_serval  # config.yaml + 1/model.py
from tests.triton_python_models import write_pbtxt as write  # config.pbtxt + 1/model.py

REPEAT = '''
import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException("repeat_int32 must be decoupled")
        self.out_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(model_config, "OUT")["data_type"])
        self.idx_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(model_config, "IDX")["data_type"])
        self.inflight = 0
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
            thread = threading.Thread(target=self.respond, daemon=True, args=(
                request.get_response_sender(), values.copy(), delays.copy()))
            with self.lock:
                self.inflight += 1
            thread.start()
            time.sleep(int(wait[0]) / 1000)
        return None

    def respond(self, sender, values, delays):
        for index in range(values.size):
            time.sleep(int(delays[index]) / 1000)
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([values[index]], self.out_dtype)),
                pb_utils.Tensor("IDX", np.array([index], self.idx_dtype))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self.lock:
            self.inflight -= 1

    def finalize(self):
        while True:
            with self.lock:
                if self.inflight == 0:
                    return
            time.sleep(0.01)
'''

REPEAT_PBTXT = """\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: True }}
input [
  {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }},
  {{ name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] }},
  {{ name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] }}
]
output [
  {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] }}
]
"""

SQUARE = '''
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            threading.Thread(target=self.respond, daemon=True,
                             args=(request.get_response_sender(), n)).start()
        return None

    def respond(self, sender, n):
        for _ in range(n):
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([n], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

SQUARE_PBTXT = """\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: True }}
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""

# MODE: what the model does with a request (N: how many responses)
MODES = {
    "bare_final": 0,  # N responses OUT = 0..N-1, then the final flag alone
    "final_with_last": 1,  # N responses, the last one carrying the final flag
    "error_midway": 2,  # OUT 0, an error response, OUT 1 with the final flag
    "raise": 3,  # execute() raises
    "until_cancelled": 4,  # OUT 0, 1, ... until cancelled; then a marker file, the final flag
    "send_after_final": 5,  # OUT 0 with the final flag, then another send: its error in OUT
}

MODES_MODEL = '''
import json
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


def out(value):
    return pb_utils.InferenceResponse(output_tensors=[
        pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        self.folder = Path(args["model_repository"])

    def execute(self, requests):
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 3:
                raise pb_utils.TritonModelException("mode 3 raises")
            if mode == 4:
                threading.Thread(target=self.until_cancelled, daemon=True,
                                 args=(request, sender)).start()
                continue
            self.respond(mode, n, sender)
        return None

    def respond(self, mode, n, sender):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if mode == 0:
            for value in range(n):
                sender.send(out(value))
            sender.send(flags=final)
        elif mode == 1:
            for value in range(n):
                sender.send(out(value), flags=final if value == n - 1 else 0)
        elif mode == 2:
            sender.send(out(0))
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "mode 2 fails its second response", pb_utils.TritonError.INVALID_ARG)))
            sender.send(out(1), flags=final)
        elif mode == 5:
            sender.send(out(0), flags=final)
            try:
                sender.send(out(1))
            except pb_utils.TritonModelException as exc:
                (self.folder / "send_after_final").write_text(str(exc))

    def until_cancelled(self, request, sender):
        sent = 0
        while not sender.is_cancelled():
            sender.send(out(sent))
            sent += 1
            time.sleep(0.005)
        marker = self.folder / ("cancelled-" + request.request_id())
        marker.write_text(json.dumps({"sent": sent, "request": request.is_cancelled()}))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

MODES_PBTXT = """\
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "N" data_type: TYPE_INT32 dims: [ 1 ] }}
]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""


# Serval's own decoupled model beside them: a `Model` whose infer is a generator; OUT = 0..N-1,
# and N < 0 fails after the first response.
COUNTER = '''
import numpy as np


class Model:
    def load(self, ctx):
        pass

    def infer(self, inputs):
        n = int(inputs["N"][0])
        for value in range(abs(n)):
            if n < 0 and value == 1:
                raise ValueError("N < 0 fails after the first response")
            yield {"OUT": np.array([value], np.int32)}
'''

COUNTER_CONFIG = """\
backend: python
max_batch_size: 0
inputs:
  - {name: N, datatype: INT32, dims: [1]}
outputs:
  - {name: OUT, datatype: INT32, dims: [1]}
"""


def build_all(root: Path) -> Path:
    write(root, "repeat_int32", REPEAT, REPEAT_PBTXT)
    write(root, "square_int32", SQUARE, SQUARE_PBTXT)
    write(root, "square_int32_x2", SQUARE,  # a worker process per instance: two streams at once
          SQUARE_PBTXT + "instance_group [ {{ count: 2, kind: KIND_CPU }} ]\n")
    write(root, "modes", MODES_MODEL, MODES_PBTXT)
    write_serval(root, "counter", COUNTER, COUNTER_CONFIG)
    return root
