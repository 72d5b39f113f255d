"""The tensors the server feeds a sequence model beside the client's (pure functions): control
inputs per batch row (START, END, READY, CORRID), implicit state in and out, empty-slot rows;
and the model as clients see it, with those tensors hidden."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache

import numpy as np

from serval.backends.base import LoadedModel, ModelMetadata
from serval.batching.sequence_policy import SequenceFlags, SequenceId
from serval.errors import BackendError, ConfigError, InvalidInput
from serval.model_config import SequenceBatchingConfig, SequenceControl
from serval.protocol.dtypes import numpy_dtype
from serval.protocol.types import TensorDict


@dataclass(frozen=True, slots=True)
class Row:
    """One batch row as the server fills it: its step's flags, its sequence's state (None:
    the initial state); None for a row of an empty slot (READY false)."""

    flags: SequenceFlags
    state: TensorDict | None


class SequenceModel:
    """A sequence model as clients see it: control inputs and state tensors hidden from its
    metadata (the server feeds them); `engine` is the model the server runs."""

    def __init__(self, engine: LoadedModel, settings: SequenceBatchingConfig) -> None:
        self.engine = engine
        hidden_in = {c.name for c in settings.controls} | {
            s.input_name for s in settings.states}
        hidden_out = {s.output_name for s in settings.states}
        native = engine.metadata
        self._metadata = ModelMetadata(
            native.platform, tuple(t for t in native.inputs if t.name not in hidden_in),
            tuple(t for t in native.outputs if t.name not in hidden_out),
            native.max_batch_size)

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def memory_bytes(self) -> int:
        return self.engine.memory_bytes()

    def unload(self) -> None:
        self.engine.unload()


def check_sequence_model(metadata: ModelMetadata, settings: SequenceBatchingConfig,
                         source: str, declared_only: bool = False) -> None:
    """ConfigError where a control or state names no tensor of the model, or a datatype
    disagrees with the model's. `declared_only`: a model that takes requests reads inputs by
    name, so a control or state its config does not declare as a tensor is fine."""
    inputs = {t.name: t for t in metadata.inputs}
    outputs = {t.name: t for t in metadata.outputs}
    wanted = [(c.name, c.datatype, inputs, "control input") for c in settings.controls]
    for state in settings.states:
        wanted.append((state.input_name, state.datatype, inputs, "state input"))
        wanted.append((state.output_name, state.datatype, outputs, "state output"))
    for name, datatype, tensors, what in wanted:
        spec = tensors.get(name)
        if spec is None and declared_only:
            continue
        if spec is None:
            raise ConfigError(f"{source}: sequence_batching {what} '{name}' is not a tensor of "
                              f"the model (it has {', '.join(sorted(tensors)) or 'none'})")
        if spec.datatype != datatype:
            raise ConfigError(f"{source}: sequence_batching {what} '{name}' is {datatype} in "
                              f"the config, the model has {spec.datatype}")


def check_corrid(settings: SequenceBatchingConfig, sequence_id: SequenceId, model: str) -> None:
    """InvalidInput when the model's CORRID control cannot carry this sequence id: a string
    for an integer CORRID, an integer past its datatype's range (numpy would refuse it in
    the batch, failing every sequence sharing it)."""
    for control in settings.controls:
        if control.kind != "corrid" or control.datatype == "BYTES":
            continue
        if isinstance(sequence_id, str):
            raise InvalidInput(f"model '{model}' takes integer sequence ids (its CORRID "
                               f"control is {control.datatype}); got the string "
                               f"{sequence_id[:64]!r}")
        largest = _largest_id(control.datatype)
        if largest is not None and sequence_id > largest:
            raise InvalidInput(f"parameter 'sequence_id' {sequence_id} is out of range for "
                               f"model '{model}': its CORRID control is {control.datatype}, "
                               f"ids 1 to {largest}")


@cache
def _largest_id(datatype: str) -> int | None:
    """The largest id an integer CORRID of `datatype` carries (once per datatype, not per
    request); None for a float CORRID (config.yaml), which takes any id, rounded."""
    dtype = numpy_dtype(datatype)
    return int(np.iinfo(dtype).max) if dtype.kind in "iu" else None


def control_tensors(controls: list[SequenceControl], rows: list[Row | None], batched: bool
                    ) -> TensorDict:
    """Each control input's [rows, 1] tensor ([1] for a model without a batch axis)."""
    tensors: TensorDict = {}
    for control in controls:
        if control.kind == "corrid":
            values: list[object] = [_corrid(row, control.datatype) for row in rows]
        else:
            values = [control.false_true[int(_flag(row, control.kind))] for row in rows]
        array = np.array(values, dtype=numpy_dtype(control.datatype))
        tensors[control.name] = array.reshape(-1, 1) if batched else array.reshape(1)
    return tensors


def _flag(row: Row | None, kind: str) -> bool:
    if row is None:
        return False
    return {"start": row.flags.start, "end": row.flags.end, "ready": True}[kind]


def _corrid(row: Row | None, datatype: str) -> object:
    if row is None:
        return "0" if datatype == "BYTES" else 0  # an empty slot: id 0, as text for BYTES
    return str(row.flags.id) if datatype == "BYTES" else row.flags.id


def initial_states(settings: SequenceBatchingConfig, given: Mapping[str, np.ndarray]
                   ) -> TensorDict:
    """Each state input's initial state with a batch axis of 1: `given` (by state input name,
    shaped as the state), else zeros."""
    initial: TensorDict = {}
    for state in settings.states:
        dims = tuple(state.dims)
        value = given.get(state.input_name)
        initial[state.input_name] = (np.zeros((1, *dims), numpy_dtype(state.datatype))
                                     if value is None else value.reshape((1, *dims)))
    return initial


def state_inputs(settings: SequenceBatchingConfig, rows: list[Row | None], batched: bool,
                 initial: TensorDict) -> TensorDict:
    """Each state input for the batch: the row's kept state, the initial state (initial_states)
    on a start row or an empty slot."""
    tensors: TensorDict = {}
    for state in settings.states:
        dims = tuple(state.dims)
        parts = []
        for row in rows:
            kept = None if row is None or row.flags.start or row.state is None else (
                row.state.get(state.input_name))
            parts.append(kept if kept is not None else initial[state.input_name])
        array = np.concatenate(parts) if len(parts) > 1 else parts[0]
        tensors[state.input_name] = array if batched else array.reshape(dims)
    return tensors


def row_states(settings: SequenceBatchingConfig, outputs: TensorDict, row: int, batched: bool,
               model: str = "") -> TensorDict:
    """One row's new state (by state input name), copied out of the batch's state outputs;
    BackendError where one is not shaped as the config's dims (a model whose state follows
    an input's shape): kept, it would break every batch it joined."""
    kept: TensorDict = {}
    for state in settings.states:
        array = outputs[state.output_name]
        dims = tuple(state.dims)
        piece = array[row:row + 1] if batched else array
        if piece.size != int(np.prod(dims)):
            shape = list(piece.shape[1:] if batched else piece.shape)
            raise BackendError(f"model '{model}' returned state output '{state.output_name}' "
                               f"shaped {shape}; its sequence_batching state dims are "
                               f"{list(dims)}")
        kept[state.input_name] = np.array(piece.reshape((1, *dims)), copy=True)
    return kept


def padded_inputs(parts: list[TensorDict | None]) -> TensorDict:
    """The clients' inputs row by row; an empty slot's row is zeros shaped like the others."""
    template = next(part for part in parts if part is not None)
    filled = [part if part is not None else {name: np.zeros_like(array)
                                             for name, array in template.items()}
              for part in parts]
    if len(filled) == 1:
        return dict(filled[0])  # a new dict: the server's tensors join it, not the request's
    return {name: np.concatenate([part[name] for part in filled]) for name in template}
