"""Bad command-line input: each is refused with one line and a non-zero exit, before anything
is changed or started (no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def serval(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "serval", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=cwd)


def assert_one_line(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--h2-stream-window-kb", "1e12"], "--h2-stream-window-kb: transport limit "
         "h2_stream_window_bytes must be at most 2,147,483,647"),
        (["--h2-connection-window-mb", "4096"], "must be at most 2,147,483,647"),
        (["--receive-budget-mb", "inf"], "'--receive-budget-mb': inf is not a finite number"),
        (["--receive-budget-mb", "nan"], "nan is not a finite number"),
        (["--max-request-mb", "-inf"], "-inf is not a finite number"),
        (["--header-timeout-s", "9" * 400], "inf is not a finite number"),
    ],
)
def test_serve_refuses_limits_beyond_range(tmp_path: Path, args: list[str], message: str
                                           ) -> None:
    assert_one_line(serval("serve", "-r", str(tmp_path), "--http-port", "0", "--grpc-port",
                           "0", *args), message)


def test_a_tokens_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_bytes(b"\xff\xfe")
    (tmp_path / "r").mkdir()
    for args in (["token", "create", "--tokens-file", str(tokens), "--scope", "read"],
                 ["serve", "-r", str(tmp_path / "r"), "--http-port", "0", "--grpc-port", "0",
                  "--auth-tokens", str(tokens)]):
        assert_one_line(serval(*args), "cannot read tokens: not UTF-8 text")
    assert tokens.read_bytes() == b"\xff\xfe"
