"""A sequence model (config sequence_batching) served: its control and state tensors checked
against the model (a model that takes requests, a Triton Python model, need not declare them),
hidden from clients, and fed by a Sequencer instead of a Batcher; initial states read from
the model's initial_state/ folder where the config names a file."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from serval.backends.base import LoadedModel, ModelVersionSpec, RequestModel, Served
from serval.batching.sequence_tensors import SequenceModel, check_sequence_model
from serval.batching.sequencer import Sequencer
from serval.errors import ConfigError
from serval.repository.data_files import INITIAL_STATE_FOLDER, read_sample
from serval.stats import ModelStats


def serve_sequences(model: LoadedModel, spec: ModelVersionSpec, stats: ModelStats,
                    executor: ThreadPoolExecutor) -> Served:
    """The model behind a Sequencer; ConfigError (the model unloaded) when the config's
    controls or states do not match the model's tensors."""
    settings = spec.config.sequence_batching
    assert settings is not None
    try:
        if model.metadata.decoupled:
            raise ConfigError(f"{spec.path.parent}/config: sequence_batching is not supported "
                              "for decoupled models")
        check_sequence_model(model.metadata, settings, f"{spec.path.parent}/config",
                             declared_only=isinstance(model, RequestModel))
        initial = {state.input_name: read_sample(
                       spec.path.parent, INITIAL_STATE_FOLDER, state.initial_file,
                       state.datatype, state.dims,
                       f"state '{state.input_name}': initial_state data_file")
                   for state in settings.states if state.initial_file is not None}
    except ConfigError:
        model.unload()
        raise
    runner = Sequencer(model, settings, stats, instances=spec.config.instances,
                       executor=executor, initial=initial)
    return Served(SequenceModel(model, settings), runner)
