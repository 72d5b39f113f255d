"""The `serval` command line: version, model listing, and one-line failures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import fixture_models

pytestmark = pytest.mark.integration


def _serval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serval", *args], capture_output=True,
                          text=True, timeout=60)


def test_version() -> None:
    result = _serval("--version")
    assert result.returncode == 0 and result.stdout.startswith("serval ")


def test_models_list_shows_valid_and_invalid_configs(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    fixture_models.add_sub(tmp_path, name="bad", config="max_batch_size: -3\n")
    result = _serval("models", "list", "--repository", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "linear" in result.stdout and "32" in result.stdout
    assert "invalid" in result.stdout and "max_batch_size" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--repository", "/no/such/dir"], "is not a directory"),
        (["models", "list", "--repository", "/no/such/dir"], "not found"),
    ],
)
def test_failures_exit_non_zero_with_one_line(args: list[str], message: str) -> None:
    result = _serval(*args)
    assert result.returncode != 0
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_serve_fails_clearly_when_the_port_is_taken(tmp_path: Path) -> None:
    import socket

    fixture_models.linear(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = _serval("serve", "--repository", str(tmp_path), "--http-port", port)
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
