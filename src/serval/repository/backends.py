"""The backend table: each `backend:` name config.yaml may give, and the class that serves it.

A backend's module is imported on first use (importlib), so a server without torch or OpenVINO
starts, and the registry never imports an engine itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from serval.backends.base import Backend, BackendOptions

BACKENDS: dict[str, str] = {
    "onnxruntime": "serval.backends.onnxruntime:OnnxRuntimeBackend",
    "openvino": "serval.backends.openvino:OpenVinoBackend",
    "pytorch": "serval.backends.torch:TorchBackend",
    "python": "serval.backends.python:PythonBackend",
    "pipeline": "serval.backends.pipeline:PipelineBackend",
}  # every name ModelConfig.backend accepts


class BackendTable(Mapping[str, Backend]):
    """Backend name -> the backend, built on first use with the server's options.

    A class is built with `from_options(options)` when it has one, else without arguments.
    """

    def __init__(self, options: BackendOptions, table: Mapping[str, str] = BACKENDS) -> None:
        self.options = options
        self._table = dict(table)
        self._built: dict[str, Backend] = {}

    def __getitem__(self, name: str) -> Backend:
        backend = self._built.get(name)
        if backend is None:
            backend = self._built[name] = self._build(self._table[name])
        return backend

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def _build(self, target: str) -> Backend:
        module_name, _, class_name = target.partition(":")
        cls = getattr(importlib.import_module(module_name), class_name)
        from_options = getattr(cls, "from_options", None)
        backend: Backend = from_options(self.options) if from_options else cls()
        return backend
