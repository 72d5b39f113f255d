"""triton_python_backend_utils as Serval provides it: what Triton's docs and examples use."""

from __future__ import annotations

import json

import numpy as np
import pytest

from serval.backends import triton_utils as pb_utils

pytestmark = pytest.mark.unit


def test_tensors_carry_their_name_array_and_triton_dtype() -> None:
    tensor = pb_utils.Tensor("OUTPUT0", np.arange(4, dtype=np.int32))
    assert tensor.name() == "OUTPUT0"
    np.testing.assert_array_equal(tensor.as_numpy(), [0, 1, 2, 3])
    assert tensor.triton_dtype() == 8 and tensor.shape() == [4] and tensor.is_cpu()
    text = pb_utils.Tensor("S", np.array([b"a", b"bc"], dtype=np.object_))
    assert text.triton_dtype() == 13


def test_a_str_array_is_refused_as_triton_does() -> None:
    with pytest.raises(pb_utils.TritonModelException, match=r"np\.object_"):
        pb_utils.Tensor("S", np.array(["a", "b"]))


def test_a_triton_dtype_reinterprets_the_bytes() -> None:
    raw = np.array([1.0], dtype=np.float32).view(np.uint8)
    tensor = pb_utils.Tensor("x", raw, triton_dtype=11)
    assert tensor.as_numpy().dtype == np.float32 and tensor.as_numpy()[0] == 1.0


def test_requests_and_responses_find_tensors_by_name() -> None:
    a, b = pb_utils.Tensor("INPUT0", np.ones(2)), pb_utils.Tensor("INPUT1", np.zeros(2))
    request = pb_utils.InferenceRequest([a, b], request_id="r1", correlation_id=7,
                                        requested_output_names=["OUTPUT0"],
                                        parameters={"k": 1})
    assert pb_utils.get_input_tensor_by_name(request, "INPUT1") is b
    assert pb_utils.get_input_tensor_by_name(request, "nope") is None
    assert request.request_id() == "r1" and request.correlation_id() == 7
    assert request.requested_output_names() == ["OUTPUT0"]
    assert json.loads(request.parameters()) == {"k": 1}
    response = pb_utils.InferenceResponse(output_tensors=[a])
    assert pb_utils.get_output_tensor_by_name(response, "INPUT0") is a
    assert not response.has_error() and response.error() is None


def test_an_error_response_carries_message_and_code() -> None:
    error = pb_utils.TritonError("bad input", pb_utils.TritonError.INVALID_ARG)
    response = pb_utils.InferenceResponse(output_tensors=[], error=error)
    assert response.has_error() and response.error() is error
    assert error.message() == str(error) == "bad input"
    assert error.code() == pb_utils.TritonError.INVALID_ARG
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    with pytest.raises(pb_utils.TritonModelException, match="must be a list"):
        pb_utils.InferenceResponse(output_tensors="nope")  # type: ignore[arg-type]


def test_bls_outside_a_worker_is_an_error_response_and_a_sender_is_for_decoupled_models(
        ) -> None:
    request = pb_utils.InferenceRequest(model_name=b"other", requested_output_names=["Y"])
    assert request.model_name() == "other"  # bytes, as read from a BYTES input, become text
    answer = request.exec()
    assert answer.has_error() and "only inside execute()" in answer.error().message()
    [streamed] = request.exec(decoupled=True)  # the same error, as the stream's one response
    assert streamed.has_error() and "only inside execute()" in streamed.error().message()
    with pytest.raises(pb_utils.TritonModelException, match="async def execute"):
        request.async_exec()
    with pytest.raises(pb_utils.TritonModelException, match="decoupled"):
        request.get_response_sender()
    assert not request.is_cancelled()
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1


def test_the_response_sender_follows_tritons_rules() -> None:
    sent: list[tuple[object, bool]] = []
    cancelled = [False]
    sender = pb_utils.InferenceResponseSender(lambda r, final: sent.append((r, final)),
                                              lambda: cancelled[0])
    request = pb_utils.InferenceRequest([], response_sender=sender)
    assert request.get_response_sender() is sender
    response = pb_utils.InferenceResponse([])
    with pytest.raises(pb_utils.TritonModelException, match="must be provided"):
        sender.send()
    with pytest.raises(pb_utils.TritonModelException, match="Unsupported flag"):
        sender.send(response, flags=2)
    sender.send(response)
    cancelled[0] = True
    assert sender.is_cancelled() and request.is_cancelled()
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert sent == [(response, False), (None, True)] and sender.closed
    with pytest.raises(pb_utils.TritonModelException,
                       match=r"^Unable to send response. Response sender has been closed.$"):
        sender.send(response)


def test_datatype_helpers_follow_tritons_table() -> None:
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is bool
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.dtype(">i4")) == 8
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.complex64) is None
    assert pb_utils.triton_to_numpy_type(1) is np.bool_
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.triton_to_numpy_type(99) is None


def test_byte_tensors_serialize_with_length_prefixes_and_back() -> None:
    array = np.array([[b"ab", "c"], [b"", b"\x00z"]], dtype=np.object_)
    raw = pb_utils.serialize_byte_tensor(array)
    assert raw == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c\x00\x00\x00\x00\x02\x00\x00\x00\x00z"
    assert pb_utils.deserialize_bytes_tensor(raw).tolist() == [b"ab", b"c", b"", b"\x00z"]
    assert pb_utils.serialize_byte_tensor(np.zeros(2)) is None


def test_config_lookups() -> None:
    config = {"input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [16]}]}
    assert pb_utils.get_input_config_by_name(config, "INPUT0")["dims"] == [16]  # type: ignore[index]
    assert pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"] == "TYPE_FP32"  # type: ignore[index]
    assert pb_utils.get_input_config_by_name(config, "OUTPUT0") is None
    assert not pb_utils.using_decoupled_model_transaction_policy(config)
    assert pb_utils.using_decoupled_model_transaction_policy(
        {"model_transaction_policy": {"decoupled": True}})


def _config(**fields: object) -> pb_utils.ModelConfig:
    return pb_utils.ModelConfig(json.dumps({"name": "m", "max_batch_size": 0, "input": [],
                                            "output": [], **fields}))


def test_auto_complete_adds_tensors_batch_size_and_scheduler() -> None:
    config = _config()
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
    config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_model_transaction_policy({"decoupled": False})
    as_dict = config.as_dict()
    assert as_dict["max_batch_size"] == 8 and as_dict["dynamic_batching"] == {}
    assert as_dict["input"] == [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
    assert as_dict["output"][0]["name"] == "OUTPUT0"
    assert as_dict["model_transaction_policy"] == {"decoupled": False}


def test_auto_complete_agrees_with_what_the_config_declares() -> None:
    declared = {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}
    config = _config(input=[declared], max_batch_size=16)
    config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})  # the same: ok
    assert len(config.as_dict()["input"]) == 1
    with pytest.raises(ValueError, match="TYPE_FP32, the model TYPE_INT32"):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [4]})
    with pytest.raises(ValueError, match="dims"):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [5]})
    with pytest.raises(ValueError, match="max_batch_size 16"):
        config.set_max_batch_size(4)
    with pytest.raises(ValueError, match="missing its 'dims'"):
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="other than"):
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1], "x": 1})
    with pytest.raises(ValueError, match="sequence_batching"):
        _config(sequence_batching={}).set_dynamic_batching()
