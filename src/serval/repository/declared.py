"""A config's inputs and outputs (config.pbtxt or config.yaml) laid over what an engine read
from its model file, as Triton does: checked against the model at load (name, data_type,
dims), served as declared, and reshaped on the way in and out where the config gives a
`reshape`."""

from __future__ import annotations

import numpy as np

from serval.backends.base import LoadedModel, ModelMetadata
from serval.errors import ConfigError, EngineRejectedInput
from serval.model_config import ModelConfig, TensorConfig
from serval.protocol.types import TensorDict, TensorSpec

# Engines whose model files describe their own tensors; the others serve what the config says.
SELF_DESCRIBING = ("onnxruntime", "openvino")

Reshapes = dict[str, tuple[int, ...]]  # tensor name -> its dims past the batch axis


def as_declared(model: LoadedModel, config: ModelConfig, source: str) -> LoadedModel:
    """The model served with the config's declared tensors, from config.pbtxt or config.yaml
    alike (the model itself when the config declares none, or its engine has no file metadata
    to check against). `source` names the config file."""
    if config.backend not in SELF_DESCRIBING:
        return model
    if not config.inputs and not config.outputs:
        return model
    native = model.metadata
    batch = (-1,) if native.max_batch_size > 0 else ()
    inputs, reshaped_inputs = overlay(native.inputs, config.inputs, batch, "input", source)
    outputs, reshaped_outputs = overlay(native.outputs, config.outputs, batch, "output", source)
    # named dimensions hold on the engine's axes: a reshaped input's served ones differ
    kept = tuple((symbol, places) for symbol, places in native.same_dims
                 if not any(name in reshaped_inputs for name, _ in places))
    metadata = ModelMetadata(native.platform, inputs, outputs, native.max_batch_size,
                             same_dims=kept)
    to_engine = {name: engine for name, (_, engine) in reshaped_inputs.items()}
    from_engine = {name: served for name, (served, _) in reshaped_outputs.items()}
    return DeclaredModel(model, metadata, to_engine, from_engine)


def overlay(native: tuple[TensorSpec, ...], declared: list[TensorConfig],
            batch: tuple[int, ...], kind: str, source: str
            ) -> tuple[tuple[TensorSpec, ...], dict[str, tuple[tuple[int, ...], tuple[int, ...]]]]:
    """The served tensors (declared ones replace the model's) and, for each reshaped one, its
    served and engine-side dims; ConfigError where the config contradicts the model."""
    by_name = {spec.name: spec for spec in native}
    served = dict(by_name)
    reshapes: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    for tensor in declared:
        spec = by_name.get(tensor.name)
        if spec is None:
            raise ConfigError(f"{source}: {kind} '{tensor.name}' is not an {kind} of the model "
                              f"(it has {', '.join(sorted(by_name)) or 'none'})")
        if tensor.datatype != spec.datatype:
            raise ConfigError(f"{source}: {kind} '{tensor.name}': data_type "
                              f"{tensor.datatype} in the config, the model has {spec.datatype}")
        engine_dims = tuple(tensor.reshape if tensor.reshape is not None else tensor.dims)
        if not fits(batch + engine_dims, spec.shape):
            what = "reshape" if tensor.reshape is not None else "dims"
            raise ConfigError(f"{source}: {kind} '{tensor.name}': {what} "
                              f"{list(engine_dims)} do not fit the model's shape "
                              f"{list(spec.shape)}")
        if tensor.reshape is not None:
            if sum(d == -1 for d in tensor.dims) > 1 or sum(d == -1 for d in engine_dims) > 1:
                raise ConfigError(f"{source}: {kind} '{tensor.name}': reshape takes at most "
                                  "one free (-1) dimension in dims and in shape")
            reshapes[tensor.name] = (tuple(tensor.dims), engine_dims)
        served[tensor.name] = TensorSpec(tensor.name, spec.datatype, batch + tuple(tensor.dims))
    return tuple(served[spec.name] for spec in native), reshapes


def fits(declared: tuple[int, ...], model: tuple[int, ...]) -> bool:
    """Declared dims the model takes: same rank, a model's fixed size declared as itself."""
    return len(declared) == len(model) and all(
        m == -1 or d == m for d, m in zip(declared, model, strict=True))


class DeclaredModel:
    """An engine's model behind the config's view of it: metadata as declared, reshapes done."""

    def __init__(self, model: LoadedModel, metadata: ModelMetadata, to_engine: Reshapes,
                 from_engine: Reshapes) -> None:
        self._model, self._metadata = model, metadata
        self._to_engine, self._from_engine = to_engine, from_engine
        self._batch_axes = 1 if metadata.max_batch_size > 0 else 0

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def infer(self, inputs: TensorDict) -> TensorDict:
        outputs = self._model.infer(self._reshape(inputs, self._to_engine))
        return self._reshape(outputs, self._from_engine)

    def memory_bytes(self) -> int:
        return self._model.memory_bytes()

    def unload(self) -> None:
        self._model.unload()

    def _reshape(self, tensors: TensorDict, shapes: Reshapes) -> TensorDict:
        if not shapes:
            return tensors
        reshaped = dict(tensors)
        for name, dims in shapes.items():
            if name in reshaped:
                array = reshaped[name]
                try:
                    reshaped[name] = np.reshape(array, array.shape[:self._batch_axes] + dims)
                except ValueError as exc:
                    raise EngineRejectedInput(
                        f"'{name}' of shape {list(array.shape)} cannot take the configured "
                        f"reshape {list(dims)}", str(exc)) from None
        return reshaped
