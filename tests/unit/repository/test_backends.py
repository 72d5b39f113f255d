"""The backend table: every name config.yaml accepts resolves, lazily, to a backend built once."""

from __future__ import annotations

import json
import subprocess
import sys
import typing

import pytest

from serval.backends.base import BackendOptions
from serval.model_config import ModelConfig
from serval.repository.backends import BACKENDS, BackendTable

pytestmark = pytest.mark.unit


def test_every_backend_name_config_yaml_accepts_has_an_entry() -> None:
    names = typing.get_args(ModelConfig.model_fields["backend"].annotation)
    assert set(BACKENDS) == set(names)


def test_backends_are_built_on_first_use_with_the_servers_options() -> None:
    table = BackendTable(BackendOptions(cores=3, allow_python_models=True))
    python = table["python"]
    assert python.name == "python" and python.allowed  # type: ignore[attr-defined]
    assert table["python"] is python  # built once
    onnx = table["onnxruntime"]
    assert onnx.name == "onnxruntime" and onnx.cores == 3  # type: ignore[attr-defined]
    assert table["pipeline"].name == "pipeline"
    assert table.get("tensorflow") is None and len(table) == len(BACKENDS)


def test_an_entry_is_imported_only_when_asked_for() -> None:
    """A fresh interpreter: using one backend imports no other backend's module."""
    script = (
        "import json, sys\n"
        "from serval.backends.base import BackendOptions\n"
        "from serval.repository.backends import BackendTable\n"
        "table = BackendTable(BackendOptions(1, False))\n"
        "assert table['python'].name == 'python'\n"
        "print(json.dumps([m for m in sys.modules if m.startswith('serval.backends.')]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, check=True)
    loaded = set(json.loads(result.stdout))
    others = {f"serval.backends.{name}" for name in ("onnxruntime", "openvino", "torch",
                                                      "pipeline")}
    assert "serval.backends.python" in loaded and not loaded & others, loaded


def test_an_unknown_module_fails_when_asked_for_not_before() -> None:
    table = BackendTable(BackendOptions(1, False), {"fake": "serval.backends.absent:Fake"})
    assert list(table) == ["fake"]
    with pytest.raises(ModuleNotFoundError):
        table["fake"]


def test_the_registry_imports_no_engine() -> None:
    """repository/ reaches engines only through the table (src is scanned, not imported)."""
    from pathlib import Path

    import serval.repository

    engines = ("onnxruntime", "openvino", "torch", "python", "pipeline")
    for path in Path(serval.repository.__file__).parent.glob("*.py"):
        source = path.read_text()
        for engine in engines:
            assert f"serval.backends.{engine} import" not in source, (path.name, engine)
            assert f"import serval.backends.{engine}" not in source, (path.name, engine)
