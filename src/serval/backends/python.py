"""Python models: a `model.py` whose `Model` class has load(ctx) and infer(inputs) -> outputs
(an infer that is a generator makes a decoupled model: backends/python_stream.py), or a Triton
Python-backend model (`TritonPythonModel`, backends/triton_python.py).

It runs arbitrary code, so the server refuses it unless started with --allow-python-models.
Inputs and outputs are batch-first numpy dicts, declared in config.yaml. A Triton model always
runs in a worker process (as Triton's own Python backend runs it), so a crash fails only its
requests.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import queue
import sys
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from serval.backends.base import (
    BackendOptions,
    LoadedModel,
    ModelMetadata,
    ModelVersionSpec,
    ServeContext,
    Served,
)
from serval.backends.declared import declared_metadata
from serval.backends.engine import EngineBackend
from serval.backends.isolated_stream import StreamingIsolatedBackend
from serval.backends.model_code import MODEL_EXITS, model_exception, unload_instance
from serval.backends.python_stream import GeneratorModel, declared_output
from serval.backends.triton_python import CLASS_NAME as TRITON_CLASS_NAME
from serval.backends.triton_python import (
    defines_triton_model,
    load_triton_model,
    provide_utils,
)
from serval.errors import ConfigError, ModelFailed, ServalError, shown
from serval.model_config import ModelConfig
from serval.protocol.types import TensorDict

MODEL_FILE = "model.py"
CLASS_NAME = "Model"


@dataclass(frozen=True, slots=True)
class LoadContext:
    """What a Python model's load() is told about itself."""

    name: str
    version: str
    model_dir: Path
    config: ModelConfig


class PythonBackend(EngineBackend):
    """Imports model.py from the version folder, once per load, under a unique module name."""

    name = "python"

    def __init__(self, allowed: bool) -> None:
        self.allowed = allowed

    @classmethod
    def from_options(cls, options: BackendOptions) -> PythonBackend:
        return cls(allowed=options.allow_python_models)

    async def serve(self, spec: ModelVersionSpec, context: ServeContext) -> Served:
        """Refused at once without --allow-python-models; a Triton model in a worker process
        (whose responses stream back as it sends them when it is decoupled)."""
        self._check_allowed(spec)
        if spec.config.isolation == "process" or await asyncio.to_thread(
                defines_triton_model, spec.path / MODEL_FILE):
            return await context.batch_engine(
                StreamingIsolatedBackend(self, context.model_caller()), spec)
        return await super().serve(spec, context)

    def load(self, spec: ModelVersionSpec) -> LoadedModel:
        self._check_allowed(spec)
        path = spec.path / MODEL_FILE
        if not path.is_file():
            raise ConfigError(f"{path}: not found (a Python model needs model.py)")
        if defines_triton_model(path):  # as Triton: modules beside model.py are importable
            module = _import(path, search_paths=(spec.path, spec.path.parent))
            triton_class = getattr(module, TRITON_CLASS_NAME, None)
            if not isinstance(triton_class, type):
                raise ConfigError(f"{path}: {TRITON_CLASS_NAME} is not a class once imported")
            return load_triton_model(triton_class, spec, path.stat().st_size)
        module = _import(path)
        metadata = declared_metadata(spec, "python")
        model_class = getattr(module, CLASS_NAME, None)
        if model_class is None or not all(hasattr(model_class, m) for m in ("load", "infer")):
            raise ConfigError(f"{path}: must define class {CLASS_NAME} with load(ctx) and "
                              f"infer(inputs) methods (or a Triton {TRITON_CLASS_NAME})")
        if inspect.isgeneratorfunction(model_class.infer):  # 0..n responses per request
            return GeneratorModel(spec.name, _instance(model_class, spec, path),
                                  replace(metadata, decoupled=True), path.stat().st_size)
        # an object per instance, as Triton's instance_group: the batcher's consumers call
        # infer() at once, and a model keeping state on self (a buffer) mixed their rows. One
        # in a worker process (it runs one batch at a time) and for sequences (any instance
        # runs a sequence's next step: what a model keeps per sequence must stay in one place)
        one = spec.config.isolation == "process" or spec.config.sequence_batching is not None
        count = 1 if one else spec.config.instances
        instances: list[Any] = []
        try:
            for _ in range(count):
                instances.append(_instance(model_class, spec, path))
        except BaseException:
            for instance in instances:
                unload_instance(spec.name, instance)
            raise
        return PythonModel(spec.name, instances, metadata, path.stat().st_size)

    def _check_allowed(self, spec: ModelVersionSpec) -> None:
        if not self.allowed:
            raise ConfigError(f"model '{spec.name}' is a Python model, which runs arbitrary "
                              "code; start the server with --allow-python-models to serve it")


def _instance(model_class: Any, spec: ModelVersionSpec, path: Path) -> Any:
    """One object of the model's class, loaded."""
    try:
        instance = model_class()
        instance.load(LoadContext(spec.name, spec.version, spec.path, spec.config))
    except MODEL_EXITS as exc:
        raise ConfigError(f"{path}: load() raised {model_exception(exc)}") from None
    return instance


class PythonModel:
    """Delegates to the user's objects (one per instance, each running one batch at a time);
    the batcher checks the rows it returns. What infer() raises fails the batch with the
    model's own error (ModelFailed: type and message)."""

    def __init__(self, name: str, instances: list[Any], metadata: ModelMetadata,
                 size_bytes: int) -> None:
        self._name, self._instances = name, instances
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for instance in instances:
            self._free.put(instance)
        self._metadata, self._size_bytes = metadata, size_bytes
        self._names = [spec.name for spec in metadata.outputs]
        self._datatypes = {spec.name: spec.datatype for spec in metadata.outputs}

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def infer(self, inputs: TensorDict) -> TensorDict:
        instance = self._free.get()
        try:  # the outputs copied before the instance may run another batch
            return self._outputs(instance.infer(inputs))
        except ServalError:
            raise
        except (Exception, *MODEL_EXITS) as exc:
            raise ModelFailed(f"model '{self._name}': infer() raised "
                              f"{model_exception(exc)}") from exc
        finally:
            self._free.put(instance)

    def _outputs(self, outputs: Any) -> TensorDict:
        if not isinstance(outputs, dict) or any(name not in outputs for name in self._names):
            got = shown(sorted(map(str, outputs)), 200) if isinstance(outputs, dict) \
                else type(outputs).__name__
            raise ModelFailed(f"model '{self._name}': infer() must return a dict with "
                              f"{shown(self._names, 200)}, got {got}")
        return {name: declared_output(self._name, name, self._datatypes[name], outputs[name],
                                      "returned") for name in self._names}

    def memory_bytes(self) -> int:
        return self._size_bytes

    def unload(self) -> None:
        for instance in self._instances:
            unload_instance(self._name, instance)


def _import(path: Path, search_paths: tuple[Path, ...] = ()) -> Any:
    """model.py as a fresh module (a unique name per load), `triton_python_backend_utils`
    importable from it, and the modules of `search_paths` (appended to sys.path: a Triton
    model has its worker process to itself)."""
    module_name = f"serval_user_model_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    provide_utils()
    sys.path.extend(str(p) for p in search_paths if str(p) not in sys.path)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, *MODEL_EXITS) as exc:
        raise ConfigError(f"{path}: import failed: {model_exception(exc)}") from None
    finally:
        sys.modules.pop(module_name, None)
    return module
