"""config.pbtxt's `sequence_batching` as Serval's sequence_batching settings (pure functions):
direct or oldest strategy, idle time, control inputs (START, END, READY, CORRID) and implicit
state, its initial state zeros or a data file."""

from __future__ import annotations

from typing import Any

from serval.errors import ConfigError
from serval.model_config import SequenceBatchingConfig, SequenceControl, SequenceState
from serval.protocol.dtypes import from_config_type, lookup
from serval.protocol.grpc import model_config_pb2 as mc

_CONTROL = {"kind": None, "int32_false_true": None, "fp32_false_true": None,
            "bool_false_true": None, "data_type": None}
# The fields of sequence_batching Serval honours (triton_config.SUPPORTED nests this).
SEQUENCE_SUPPORTED: dict[str, Any] = {
    "direct": {"max_queue_delay_microseconds": None},
    "oldest": {"max_candidate_sequences": None, "max_queue_delay_microseconds": None},
    "max_sequence_idle_microseconds": None,
    "control_input": {"name": None, "control": _CONTROL},
    "state": {"input_name": None, "output_name": None, "data_type": None, "dims": None,
              "initial_state": {"name": None, "data_type": None, "dims": None,
                                "zero_data": None, "data_file": None}},
}
_KINDS = {mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: "start",
          mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: "end",
          mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: "ready",
          mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: "corrid"}
_CORRID_TYPES = ("UINT64", "INT64", "UINT32", "INT32", "BYTES")


def sequence_settings(batching: mc.ModelSequenceBatching, source: str) -> dict[str, Any]:
    """sequence_batching as ModelConfig's settings; ConfigError naming what cannot be honoured."""
    where = "field 'sequence_batching"
    strategy = batching.WhichOneof("strategy_choice") or "direct"
    settings: dict[str, Any] = {
        "strategy": strategy,
        "controls": [_control(item, f"{where}.control_input' '{item.name}'", source)
                     for item in batching.control_input],
        "states": [_state(item, f"{where}.state' '{item.input_name}'", source)
                   for item in batching.state],
    }
    if batching.max_sequence_idle_microseconds:
        settings["max_sequence_idle_ms"] = batching.max_sequence_idle_microseconds / 1000
    chosen = batching.oldest if strategy == "oldest" else batching.direct
    settings["max_queue_delay_ms"] = chosen.max_queue_delay_microseconds / 1000
    if strategy == "oldest" and batching.oldest.max_candidate_sequences > 0:
        settings["max_candidate_sequences"] = batching.oldest.max_candidate_sequences
    return settings


def _control(item: mc.ModelSequenceBatching.ControlInput, where: str, source: str
             ) -> dict[str, Any]:
    if len(item.control) != 1:
        raise ConfigError(f"{source}: {where}: give exactly one control per control input")
    control = item.control[0]
    kind = _KINDS[control.kind]
    if kind == "corrid":
        datatype = _datatype(control.data_type, where, source)
        if datatype not in _CORRID_TYPES:
            raise ConfigError(f"{source}: {where}: CORRID data_type must be TYPE_UINT64, "
                              "TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING")
        return {"name": item.name, "kind": kind, "datatype": datatype}
    choices = [("INT32", list(control.int32_false_true)),
               ("FP32", list(control.fp32_false_true)),
               ("BOOL", [float(v) for v in control.bool_false_true])]
    given = [(datatype, values) for datatype, values in choices if values]
    if len(given) != 1 or len(given[0][1]) != 2:
        raise ConfigError(f"{source}: {where}: give one of int32_false_true, fp32_false_true "
                          "or bool_false_true, with two values [false, true]")
    datatype, values = given[0]
    return {"name": item.name, "kind": kind, "datatype": datatype,
            "false_true": (values[0], values[1])}


def _state(item: mc.ModelSequenceBatching.State, where: str, source: str) -> dict[str, Any]:
    if any(d < 1 for d in item.dims):
        raise ConfigError(f"{source}: {where}: dims {list(item.dims)} must be fixed sizes "
                          "(Serval keeps fixed-size states)")
    state = {"input_name": item.input_name, "output_name": item.output_name,
             "datatype": _datatype(item.data_type, where, source), "dims": list(item.dims)}
    if len(item.initial_state) > 1:
        raise ConfigError(f"{source}: {where}: give at most one initial_state")
    for initial in item.initial_state:
        if initial.data_type not in (mc.TYPE_INVALID, item.data_type) or (
                initial.dims and list(initial.dims) != list(item.dims)):
            raise ConfigError(f"{source}: {where}: initial_state '{initial.name}' must have "
                              f"the state's data_type and dims {list(item.dims)}")
        if initial.WhichOneof("state_data") == "data_file":
            state["initial_file"] = initial.data_file
    return state


def _datatype(value: int, where: str, source: str) -> str:
    config_name = mc.DataType.Name(value)
    datatype = from_config_type(config_name)
    if datatype is None:
        raise ConfigError(f"{source}: {where}: data_type {config_name} is not supported")
    return datatype


_KIND_NAMES = {kind: mc.ModelSequenceBatching.Control.Kind.Name(number)
               for number, kind in _KINDS.items()}
_FALSE_TRUE = {"INT32": "int32_false_true", "FP32": "fp32_false_true",
               "BOOL": "bool_false_true"}


def triton_sequence_batching(settings: SequenceBatchingConfig) -> dict[str, Any]:
    """Serval's sequence_batching settings in Triton's JSON form (the model configuration
    extension shows a config.yaml sequence model as Triton would)."""
    delay_us = int(settings.max_queue_delay_ms * 1000)
    strategy: dict[str, Any] = {"max_queue_delay_microseconds": delay_us}
    if settings.strategy == "oldest" and settings.max_candidate_sequences:
        strategy["max_candidate_sequences"] = settings.max_candidate_sequences
    return {
        settings.strategy: strategy,
        "max_sequence_idle_microseconds": int(settings.max_sequence_idle_ms * 1000),
        "control_input": [{"name": control.name, "control": [_triton_control(control)]}
                          for control in settings.controls],
        "state": [_triton_state(state) for state in settings.states],
    }


def _triton_state(state: SequenceState) -> dict[str, Any]:
    data_type = lookup(state.datatype).config
    shown: dict[str, Any] = {"input_name": state.input_name, "output_name": state.output_name,
                             "data_type": data_type, "dims": state.dims}
    if state.initial_file is not None:
        shown["initial_state"] = [{"name": "initial", "data_type": data_type,
                                   "dims": state.dims, "data_file": state.initial_file}]
    return shown


def _triton_control(control: SequenceControl) -> dict[str, Any]:
    kind = _KIND_NAMES[control.kind]
    if control.kind == "corrid":
        return {"kind": kind, "data_type": lookup(control.datatype).config}
    values: list[Any] = list(control.false_true)
    if control.datatype == "BOOL":
        values = [bool(v) for v in values]
    elif control.datatype == "INT32":
        values = [int(v) for v in values]
    return {"kind": kind, _FALSE_TRUE[control.datatype]: values}
