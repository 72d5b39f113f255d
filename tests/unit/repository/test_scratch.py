"""Private folders for clients' files: a server killed before it could remove its folders
has them swept by the next one, a live server's folders are never swept, and a normal exit
leaves none."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from serval.repository import scratch

pytestmark = pytest.mark.unit

_SERVER = """
import sys
from serval.repository.scratch import private_folder
folder = private_folder()
(folder / "model.onnx").write_bytes(b"x" * 1000)
print(folder, flush=True)
sys.stdin.readline()
"""


def _server(tmp: Path) -> tuple[subprocess.Popen[str], Path]:
    """A process that wrote a client's files (TMPDIR=tmp) and lives until told to end."""
    process = subprocess.Popen([sys.executable, "-c", _SERVER], text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               env={**os.environ, "TMPDIR": str(tmp)})
    assert process.stdout is not None
    folder = Path(process.stdout.readline().strip())
    assert folder.is_dir() and folder.parent.parent == tmp
    return process, folder


def test_the_folders_of_a_killed_server_are_swept(tmp_path: Path) -> None:
    process, folder = _server(tmp_path)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert folder.exists()  # nobody removed it
    assert scratch.sweep(tmp_path) == 1
    assert not folder.parent.exists()


def test_the_folders_of_a_live_server_are_kept(tmp_path: Path) -> None:
    process, folder = _server(tmp_path)
    try:
        assert scratch.sweep(tmp_path) == 0
        assert (folder / "model.onnx").read_bytes() == b"x" * 1000
    finally:
        process.communicate("\n")
    assert not folder.parent.exists()  # a normal exit removes it


def test_what_is_not_a_servers_locked_folder_is_left_alone(tmp_path: Path) -> None:
    unlocked = tmp_path / f"{scratch.PREFIX}nolock"
    unlocked.mkdir()
    other = tmp_path / "serval-something-else"
    other.mkdir()
    (tmp_path / f"{scratch.PREFIX}file").write_text("not a folder")
    (tmp_path / f"{scratch.PREFIX}link").symlink_to(other)
    building = tmp_path / f"{scratch.PREFIX}new-abc"
    building.mkdir()
    (building / scratch.LOCK_FILE).write_text("")
    assert scratch.sweep(tmp_path) == 0
    assert unlocked.is_dir() and other.is_dir() and building.is_dir()
    assert scratch.sweep(tmp_path / "missing") == 0
