"""The tensors the server feeds a sequence model: controls per row, implicit state, padding,
and the model's metadata with them hidden."""

from __future__ import annotations

import numpy as np
import pytest

from serval.backends.base import ModelMetadata
from serval.batching.sequence_policy import SequenceFlags
from serval.batching.sequence_tensors import (
    Row,
    SequenceModel,
    check_corrid,
    check_sequence_model,
    control_tensors,
    initial_states,
    padded_inputs,
    row_states,
    state_inputs,
)
from serval.errors import ConfigError, InvalidInput
from serval.model_config import SequenceBatchingConfig, SequenceControl, SequenceState
from serval.protocol.types import TensorDict, TensorSpec

pytestmark = pytest.mark.unit

SETTINGS = SequenceBatchingConfig(
    controls=[SequenceControl(name="S", kind="start"),
              SequenceControl(name="E", kind="end", datatype="FP32", false_true=(-1.0, 2.0)),
              SequenceControl(name="R", kind="ready", datatype="BOOL"),
              SequenceControl(name="C", kind="corrid", datatype="UINT64")],
    states=[SequenceState(input_name="h_in", output_name="h_out", datatype="FP32", dims=[2])])
METADATA = ModelMetadata("onnxruntime_onnx", (
    TensorSpec("x", "FP32", (-1, 1)), TensorSpec("S", "INT32", (-1, 1)),
    TensorSpec("E", "FP32", (-1, 1)), TensorSpec("R", "BOOL", (-1, 1)),
    TensorSpec("C", "UINT64", (-1, 1)), TensorSpec("h_in", "FP32", (-1, 2))),
    (TensorSpec("y", "FP32", (-1, 1)), TensorSpec("h_out", "FP32", (-1, 2))), 8)


class Engine:
    metadata = METADATA

    def infer(self, inputs: TensorDict) -> TensorDict:
        return {}

    def memory_bytes(self) -> int:
        return 7

    def unload(self) -> None:
        pass


def test_controls_fill_each_row_and_empty_slots() -> None:
    rows = [Row(SequenceFlags(9, start=True), None), None, Row(SequenceFlags(4, end=True), None)]
    tensors = control_tensors(SETTINGS.controls, rows, batched=True)
    assert tensors["S"].dtype == np.int32 and tensors["S"].ravel().tolist() == [1, 0, 0]
    assert tensors["E"].dtype == np.float32 and tensors["E"].ravel().tolist() == [-1, -1, 2]
    assert tensors["R"].dtype == np.bool_ and tensors["R"].ravel().tolist() == [True, False, True]
    assert tensors["C"].dtype == np.uint64 and tensors["C"].ravel().tolist() == [9, 0, 4]
    assert tensors["S"].shape == (3, 1)
    corrid = SequenceControl(name="C", kind="corrid", datatype="BYTES")
    strings = control_tensors([corrid], [Row(SequenceFlags("abc"), None), None], batched=True)
    assert strings["C"].ravel().tolist() == ["abc", "0"]


def test_state_is_initial_on_start_and_kept_otherwise() -> None:
    kept = {"h_in": np.array([[1.0, 2.0]], np.float32)}
    rows = [Row(SequenceFlags(1), kept), Row(SequenceFlags(2, start=True), kept), None]
    tensors = state_inputs(SETTINGS, rows, True, initial_states(SETTINGS, {}))
    assert tensors["h_in"].tolist() == [[1.0, 2.0], [0.0, 0.0], [0.0, 0.0]]  # zeros
    from_file = initial_states(SETTINGS, {"h_in": np.array([9.0, 8.0], np.float32)})
    tensors = state_inputs(SETTINGS, rows, True, from_file)
    assert tensors["h_in"].tolist() == [[1.0, 2.0], [9.0, 8.0], [9.0, 8.0]]
    outputs = {"h_out": np.array([[5.0, 6.0], [7.0, 8.0]], np.float32)}
    state = row_states(SETTINGS, outputs, 1, batched=True)
    outputs["h_out"][1] = 0  # a copy, not a view of the batch's output
    assert state["h_in"].tolist() == [[7.0, 8.0]]


def test_padding_rows_are_zeros_like_the_others() -> None:
    part = {"x": np.array([[3.0]], np.float32)}
    assert padded_inputs([None, part])["x"].tolist() == [[0.0], [3.0]]
    alone = padded_inputs([part])
    assert alone == part and alone is not part  # the request's own dict is left as it was


def test_the_model_clients_see_hides_controls_and_state() -> None:
    model = SequenceModel(Engine(), SETTINGS)
    assert [t.name for t in model.metadata.inputs] == ["x"]
    assert [t.name for t in model.metadata.outputs] == ["y"]
    assert model.memory_bytes() == 7


def test_controls_and_states_are_checked_against_the_model() -> None:
    check_sequence_model(METADATA, SETTINGS, "cfg")
    missing = SETTINGS.model_copy(update={"controls": [SequenceControl(name="Z", kind="ready")]})
    with pytest.raises(ConfigError, match="control input 'Z' is not a tensor of the model"):
        check_sequence_model(METADATA, missing, "cfg")
    wrong = SETTINGS.model_copy(update={"controls": [SequenceControl(name="S", kind="start",
                                                                     datatype="FP32")]})
    with pytest.raises(ConfigError, match="'S' is FP32 in the config, the model has INT32"):
        check_sequence_model(METADATA, wrong, "cfg")


def test_a_string_id_needs_a_string_corrid() -> None:
    check_corrid(SETTINGS, 5, "m")
    with pytest.raises(InvalidInput, match="integer sequence ids"):
        check_corrid(SETTINGS, "x", "m")
