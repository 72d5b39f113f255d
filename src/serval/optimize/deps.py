"""Optional libraries of `serval optimize`, imported lazily; a one-line reason when absent."""

from __future__ import annotations

import importlib
from types import ModuleType

from serval.errors import ConfigError

EXTRA = "optimize"


class MissingDependency(ConfigError):
    """A library `serval optimize` needs for this step is not installed."""


def require(module: str, package: str | None = None, extra: str = EXTRA) -> ModuleType:
    """Import `module` or raise MissingDependency naming the pip extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        name = package or module.split(".")[0]
        raise MissingDependency(
            f"this step needs {name}, which is not installed: pip install 'serval-server[{extra}]'"
        ) from None
