"""The local cluster's run folder (admin socket, membership requests) at a predictable name:
made private, and refused when someone else could have prepared it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serval.cluster.local import private_folder
from serval.errors import ConfigError

pytestmark = pytest.mark.unit


def test_a_new_run_folder_is_private(tmp_path: Path) -> None:
    folder = private_folder(tmp_path / "serval-cluster-8000")
    assert folder.stat().st_mode & 0o777 == 0o700
    assert private_folder(folder) == folder  # ours already: reused


@pytest.mark.parametrize("prepare", ["world-writable", "a link", "another user's"])
def test_a_run_folder_someone_else_could_write_is_refused(tmp_path: Path, prepare: str) -> None:
    folder = tmp_path / "serval-cluster-8000"
    if prepare == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder.symlink_to(tmp_path / "elsewhere")
    else:
        folder.mkdir(mode=0o700)
        if prepare == "world-writable":
            folder.chmod(0o777)
        elif os.getuid() == 0:
            os.chown(folder, 12345, 12345)
        else:
            pytest.skip("only root can give a folder to another user")
    with pytest.raises(ConfigError, match="not a private folder"):
        private_folder(folder)
