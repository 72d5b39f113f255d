"""The gRPC codec's shared-memory parts: shm inputs have no raw entry of their own, contents
beside shm are refused, shm outputs answer with parameters and an empty raw entry."""

from __future__ import annotations

import numpy as np
import pytest

from serval.errors import InvalidInput
from serval.protocol.grpc import grpc_service_pb2 as pb
from serval.protocol.grpc.codec import decode_infer_request, encode_infer_response
from serval.protocol.types import InferResponse

pytestmark = pytest.mark.unit


def _shm_input(message: pb.ModelInferRequest, name: str, offset: int = 0) -> None:
    tensor = message.inputs.add(name=name, datatype="INT32", shape=[1, 2])
    tensor.parameters["shared_memory_region"].string_param = "r"
    tensor.parameters["shared_memory_byte_size"].int64_param = 8
    if offset:
        tensor.parameters["shared_memory_offset"].int64_param = offset


def test_raw_contents_count_only_the_inputs_not_in_shared_memory() -> None:
    message = pb.ModelInferRequest(model_name="m")
    _shm_input(message, "a")
    message.inputs.add(name="b", datatype="INT32", shape=[1, 2])
    _shm_input(message, "c", offset=8)
    message.raw_input_contents.append(np.array([5, 6], np.int32).tobytes())
    output = message.outputs.add(name="o")
    output.parameters["shared_memory_region"].string_param = "r"
    output.parameters["shared_memory_byte_size"].int64_param = 8
    request = decode_infer_request(message)
    assert request.inputs["b"].tolist() == [[5, 6]]
    assert set(request.shared_memory_inputs) == {"a", "c"}
    assert request.shared_memory_inputs["c"].ref.offset == 8
    assert request.outputs is not None and request.outputs[0].shared_memory is not None
    message.raw_input_contents.append(b"")
    with pytest.raises(InvalidInput, match="2 entries for 1 inputs not in shared memory"):
        decode_infer_request(message)


def test_contents_beside_shared_memory_are_refused() -> None:
    message = pb.ModelInferRequest(model_name="m")
    _shm_input(message, "a")
    message.inputs[0].contents.int_contents.extend([1, 2])
    with pytest.raises(InvalidInput, match="must not carry contents as well"):
        decode_infer_request(message)


def test_outputs_in_shared_memory_answer_with_parameters() -> None:
    response = InferResponse("m", "1", {"o": np.ones(2, np.int32), "p": np.zeros(1, np.int32)},
                             shared_memory_outputs={"o": {"shared_memory_region": "r",
                                                          "shared_memory_byte_size": 8,
                                                          "shared_memory_offset": 4}})
    message = encode_infer_response(response)
    parameters = message.outputs[0].parameters
    assert parameters["shared_memory_region"].string_param == "r"
    assert parameters["shared_memory_byte_size"].int64_param == 8
    assert parameters["shared_memory_offset"].int64_param == 4
    assert list(message.raw_output_contents) == [b"", np.zeros(1, np.int32).tobytes()]
