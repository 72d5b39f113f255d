"""config.pbtxt's sequence_batching mapped onto Serval's settings, and what Serval refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from serval.errors import ConfigError
from serval.model_config import ModelConfig, SequenceControl, SequenceState
from serval.protocol.grpc import model_config_pb2 as mc
from serval.repository.triton_config import to_model_config

pytestmark = pytest.mark.unit

FULL = """
max_batch_size: 4
sequence_batching {
  oldest { max_candidate_sequences: 3 max_queue_delay_microseconds: 2000 }
  max_sequence_idle_microseconds: 250000
  control_input [
    { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "E" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "R" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 5, 6 ] } ] },
    { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
  state [ { input_name: "h_in" output_name: "h_out" data_type: TYPE_FP32 dims: [ 2, 3 ]
            initial_state { data_type: TYPE_FP32 dims: [ 2, 3 ] zero_data: true name: "z" } } ]
}
"""


def _map(text: str, folder: Path) -> ModelConfig:
    (folder / "m").mkdir(parents=True, exist_ok=True)
    return to_model_config(text_format.Parse(text, mc.ModelConfig()), folder / "m", "cfg")


def test_every_sequence_field_maps(tmp_path: Path) -> None:
    settings = _map(FULL, tmp_path).sequence_batching
    assert settings is not None
    assert (settings.strategy, settings.max_candidate_sequences) == ("oldest", 3)
    assert (settings.max_sequence_idle_ms, settings.max_queue_delay_ms) == (250.0, 2.0)
    assert settings.controls == [
        SequenceControl(name="S", kind="start", datatype="FP32", false_true=(0.0, 1.0)),
        SequenceControl(name="E", kind="end", datatype="BOOL", false_true=(0.0, 1.0)),
        SequenceControl(name="R", kind="ready", datatype="INT32", false_true=(5.0, 6.0)),
        SequenceControl(name="C", kind="corrid", datatype="BYTES")]
    assert settings.states == [SequenceState(input_name="h_in", output_name="h_out",
                                             datatype="FP32", dims=[2, 3])]


def test_an_initial_state_data_file_is_named_for_the_load(tmp_path: Path) -> None:
    text = FULL.replace("zero_data: true", 'data_file: "h0.bin"')
    settings = _map(text, tmp_path).sequence_batching
    assert settings is not None
    assert settings.states[0].initial_file == "h0.bin"


def test_defaults_are_triton_s(tmp_path: Path) -> None:
    settings = _map("max_batch_size: 4\nsequence_batching { }", tmp_path).sequence_batching
    assert settings is not None
    assert (settings.strategy, settings.max_sequence_idle_ms) == ("direct", 1000.0)
    assert _map("max_batch_size: 4", tmp_path).sequence_batching is None


@pytest.mark.parametrize("text,named", [
    ("sequence_batching { iterative_sequence: true }",
     "field 'sequence_batching.iterative_sequence'"),
    ("sequence_batching { direct { minimum_slot_utilization: 0.5 } }",
     "field 'sequence_batching.direct.minimum_slot_utilization'"),
    ('sequence_batching { control_input [ { name: "S" control [ { kind: '
     "CONTROL_SEQUENCE_START } ] } ] }", "int32_false_true"),
    ('sequence_batching { control_input [ { name: "S" } ] }', "exactly one control"),
    ('sequence_batching { control_input [ { name: "C" control [ { kind: '
     "CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ] }", "CORRID data_type"),
    ('sequence_batching { state [ { input_name: "a" output_name: "b" data_type: TYPE_FP32 '
     "dims: [ -1 ] } ] }", "fixed sizes"),
    ('sequence_batching { state [ { input_name: "a" output_name: "b" data_type: TYPE_FP32 '
     'dims: [ 1 ] initial_state { data_type: TYPE_FP32 dims: [ 2 ] data_file: "f" } } ] }',
     "must have the state's data_type and dims [1]"),
    ('sequence_batching { state [ { input_name: "a" output_name: "b" data_type: TYPE_FP32 '
     'dims: [ 1 ] initial_state [ { zero_data: true }, { data_file: "f" } ] } ] }',
     "at most one initial_state"),
])
def test_what_serval_cannot_honour_is_named(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError, match="cfg: ") as refused:
        _map("max_batch_size: 4\n" + text, tmp_path)
    assert named in str(refused.value)


def test_settings_shown_in_tritons_form_read_back_the_same() -> None:
    """Serval's settings in Triton's JSON form (the model configuration extension) parse with
    Triton's schema and map back onto the same settings."""
    from google.protobuf import json_format

    from serval.model_config import SequenceBatchingConfig
    from serval.repository.triton_sequence import sequence_settings, triton_sequence_batching

    settings = SequenceBatchingConfig(
        strategy="oldest", max_sequence_idle_ms=250.0, max_candidate_sequences=3,
        max_queue_delay_ms=2.0,
        controls=[SequenceControl(name="S", kind="start", datatype="FP32"),
                  SequenceControl(name="E", kind="end", datatype="BOOL"),
                  SequenceControl(name="R", kind="ready", datatype="INT32", false_true=(5, 6)),
                  SequenceControl(name="C", kind="corrid", datatype="BYTES")],
        states=[SequenceState(input_name="h_in", output_name="h_out", datatype="FP32",
                              dims=[2, 3]),
                SequenceState(input_name="c_in", output_name="c_out", datatype="INT32",
                              dims=[4], initial_file="c0.bin")])
    shown = json_format.ParseDict(triton_sequence_batching(settings),
                                  mc.ModelSequenceBatching())
    assert SequenceBatchingConfig(**sequence_settings(shown, "test")) == settings
