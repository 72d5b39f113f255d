"""What the package may import: the server runs without grpcio (a test and bench dependency)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src"


def test_the_server_imports_no_grpc_module() -> None:
    """Every module of serval.server imports with grpcio made unimportable, and none loads it."""
    script = (
        "import pkgutil, sys\n"
        "sys.modules['grpc'] = None  # import grpc now raises ImportError\n"
        "import serval.server\n"
        "for module in pkgutil.walk_packages(serval.server.__path__, 'serval.server.'):\n"
        "    __import__(module.name)\n"
        "loaded = sorted(m for m in sys.modules if m == 'grpc' or m.startswith('grpc.'))\n"
        "assert loaded == ['grpc'], loaded  # only the blocker\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(SRC), "PATH": ""})
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr[-2000:]
