"""Triton Python-backend models that run other models (business logic scripting), written as
a Triton user writes them: `pb_utils.InferenceRequest(model_name=..., ...).exec()`, and
`async_exec()` from an `async def execute`."""

from __future__ import annotations

from pathlib import Path

from tests import fixture_models, triton_decoupled_models
from tests.triton_python_models import ADD_SUB

# Runs the model named by MODEL_NAME on INPUT0 and INPUT1 and answers its outputs; its error,
# if any, becomes this request's error.
BLS_SYNC = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            target = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy().flat[0]
            call = pb_utils.InferenceRequest(
                model_name=target, requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[in0, in1])
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=answer.output_tensors()))
        return responses
'''

# OUTPUT0 from the ONNX add_sub, OUTPUT1 from the Python one, both asked at once.
BLS_ASYNC = '''
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                      pb_utils.get_input_tensor_by_name(request, "INPUT1")]
            calls = [pb_utils.InferenceRequest(
                         model_name=name, requested_output_names=["OUTPUT0", "OUTPUT1"],
                         inputs=inputs).async_exec()
                     for name in ("add_sub_onnx", "add_sub")]
            onnx, python = await asyncio.gather(*calls)
            for answer in (onnx, python):
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(onnx, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(python, "OUTPUT1")]))
        return responses
'''

# Decoupled: runs add_sub_onnx once per request, then streams OUTPUT0 twice (x1, x2).
BLS_DECOUPLED = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            answer = pb_utils.InferenceRequest(
                model_name="add_sub_onnx", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")]).exec()
            if answer.has_error():
                sender.send(pb_utils.InferenceResponse(error=answer.error()),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            total = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total * 2)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# Answers, in each row of OUTPUT0, how many requests its batch held (it batches by preferring
# 4 and otherwise waiting up to 5 s for more).
ROWS_SEEN = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUTPUT0", np.full((1, 16), len(requests), np.float32))])
                for _ in requests]
'''

# Asks rows_seen four times at once; OUTPUT0 is the smallest batch any of them was part of.
BLS_FANOUT = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                      pb_utils.get_input_tensor_by_name(request, "INPUT1")]
            answers = await asyncio.gather(*(pb_utils.InferenceRequest(
                model_name="rows_seen", requested_output_names=["OUTPUT0"],
                inputs=inputs).async_exec() for _ in range(4)))
            seen = min(pb_utils.get_output_tensor_by_name(a, "OUTPUT0").as_numpy().min()
                       for a in answers)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", np.full((1, 16), seen, np.float32))]))
        return responses
'''


# exec(decoupled=True) on square_int32 (IN = n: n responses OUT = n, then a final one without
# outputs): SUM of the OUTs, COUNT of the responses the iterator gave (n + 1, as Triton).
BLS_SQUARE_SUM = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            total, count = 0, 0
            call = pb_utils.InferenceRequest(
                model_name="square_int32", requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                count += 1
                if len(response.output_tensors()) > 0:
                    total += int(pb_utils.get_output_tensor_by_name(response, "OUT")
                                 .as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([total], np.int32)),
                pb_utils.Tensor("COUNT", np.array([count], np.int32))]))
        return responses
'''

# The same from an async execute: two streamed calls gathered, their responses summed.
BLS_SQUARE_SUM_ASYNC = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            calls = [pb_utils.InferenceRequest(
                         model_name="square_int32", requested_output_names=["OUT"],
                         inputs=[pb_utils.get_input_tensor_by_name(request, "IN")]
                     ).async_exec(decoupled=True) for _ in range(2)]
            total, count = 0, 0
            for stream in await asyncio.gather(*calls):
                for response in stream:
                    count += 1
                    if len(response.output_tensors()) > 0:
                        total += int(pb_utils.get_output_tensor_by_name(response, "OUT")
                                     .as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([total], np.int32)),
                pb_utils.Tensor("COUNT", np.array([count], np.int32))]))
        return responses
'''

# Cancels its streamed call after the first response: SUM 1 when the stream then ended with a
# CANCELLED error, COUNT the responses with outputs it got (far fewer than IN).
BLS_SQUARE_CANCEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            stream = pb_utils.InferenceRequest(
                model_name="square_int32", requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")]).exec(decoupled=True)
            count, cancelled = 0, 0
            for response in stream:
                if response.has_error():
                    cancelled = int(response.error().code() == pb_utils.TritonError.CANCELLED)
                    break
                count += len(response.output_tensors())
                stream.cancel()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([cancelled], np.int32)),
                pb_utils.Tensor("COUNT", np.array([count], np.int32))]))
        return responses
'''

# exec(decoupled=True) on a model that is not decoupled: one response, then the end.
BLS_STREAM_PLAIN = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            answers = list(pb_utils.InferenceRequest(
                model_name="add_sub_onnx", requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")]
            ).exec(decoupled=True))
            if len(answers) != 1:
                raise pb_utils.TritonModelException(f"{len(answers)} responses")
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.get_output_tensor_by_name(answers[0], "OUTPUT0")]))
        return responses
'''

SQUARE_SUM_PBTXT = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
"""


def _pbtxt(name: str, model_name_input: bool = False, two_outputs: bool = True,
           decoupled: bool = False) -> str:
    """A Python model's config.pbtxt: FP32 [16] INPUT0, INPUT1 (and MODEL_NAME) in, OUTPUT0
    (and OUTPUT1) out, batches of up to 8."""
    inputs = ['{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }',
              '{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }']
    if model_name_input:
        inputs.append('{ name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] }')
    outputs = [f'{{ name: "OUTPUT{i}" data_type: TYPE_FP32 dims: [ 16 ] }}'
               for i in range(2 if two_outputs else 1)]
    policy = "model_transaction_policy { decoupled: true }\n" if decoupled else ""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n{policy}'
            f"input [ {', '.join(inputs)} ]\noutput [ {', '.join(outputs)} ]\n")


def _write(root: Path, name: str, source: str, pbtxt: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(pbtxt)
    (root / name / "1" / "model.py").write_text(source)


def build(root: Path) -> Path:
    """bls_sync, bls_async and bls_decoupled over add_sub (Python) and add_sub_onnx;
    bls_fanout over rows_seen; the streamed calls (exec(decoupled=True)) over square_int32
    (decoupled) and add_sub_onnx."""
    _write(root, "add_sub", ADD_SUB, _pbtxt("add_sub"))
    fixture_models.add_sub(root, "add_sub_onnx", config="max_batch_size: 8\n")
    _write(root, "bls_sync", BLS_SYNC, _pbtxt("bls_sync", model_name_input=True))
    _write(root, "bls_async", BLS_ASYNC, _pbtxt("bls_async"))
    _write(root, "bls_decoupled", BLS_DECOUPLED,
           _pbtxt("bls_decoupled", two_outputs=False, decoupled=True))
    _write(root, "rows_seen", ROWS_SEEN, _pbtxt("rows_seen", two_outputs=False)
           + "dynamic_batching { preferred_batch_size: [ 4 ] "
           "max_queue_delay_microseconds: 5000000 }\n")
    _write(root, "bls_fanout", BLS_FANOUT, _pbtxt("bls_fanout", two_outputs=False))
    _write(root, "square_int32", triton_decoupled_models.SQUARE,
           triton_decoupled_models.SQUARE_PBTXT.format(name="square_int32"))
    for name, source in (("bls_square_sum", BLS_SQUARE_SUM),
                         ("bls_square_sum_async", BLS_SQUARE_SUM_ASYNC),
                         ("bls_square_cancel", BLS_SQUARE_CANCEL)):
        _write(root, name, source, SQUARE_SUM_PBTXT.format(name=name))
    _write(root, "bls_stream_plain", BLS_STREAM_PLAIN,
           _pbtxt("bls_stream_plain", two_outputs=False))
    return root
