"""Private folders for the files clients send with a load (repository/overrides.py), removed
even when the server that wrote them was killed before it could.

Each server process keeps its folders under one folder of its own in the temporary directory,
`serval-loads-<random>/`, holding a `lock` file the process keeps locked (flock) as long as it
lives, and removes at a normal exit. The first time a server process needs a folder it sweeps
away those of processes killed before they could: a lock it can take belongs to nobody. A
lock works across PID namespaces and is released by the kernel however the process ends, so
a live server's folder is never taken for a dead one's.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

PREFIX = "serval-loads-"
_BUILDING = "serval-loads-new-"  # not yet locked: never swept
LOCK_FILE = "lock"

_mutex = threading.Lock()
_held: tuple[Path, int] | None = None  # this process's folder and its locked file


def private_folder() -> Path:
    """A new private folder (0700) under this process's own; the first call sweeps."""
    return Path(tempfile.mkdtemp(dir=_own_root()))


def _own_root() -> Path:
    global _held
    with _mutex:
        if _held is not None and _held[0].is_dir():
            return _held[0]
        if _held is None:
            sweep(Path(tempfile.gettempdir()))
            atexit.register(_remove_own)
        else:
            os.close(_held[1])  # someone removed the folder under us: make another
        _held = _locked_root()
        return _held[0]


def _locked_root() -> tuple[Path, int]:
    """Made under a name sweeps skip, locked, then renamed: a sweep never finds it unlocked."""
    building = Path(tempfile.mkdtemp(prefix=_BUILDING))
    descriptor = os.open(building / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    root = Path(tempfile.mkdtemp(prefix=PREFIX))
    os.replace(building, root)  # an empty folder is replaced
    return root, descriptor


def _remove_own() -> None:
    """At a normal exit: this process's folder goes with it (the sweep is for the others)."""
    if _held is not None:
        shutil.rmtree(_held[0], ignore_errors=True)


def sweep(directory: Path) -> int:
    """Remove the folders under `directory` that processes gone left (this user's, with a
    lock nobody holds); returns how many."""
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        if not entry.name.startswith(PREFIX) or entry.name.startswith(_BUILDING):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if _abandoned(Path(entry.path)):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


def _abandoned(root: Path) -> bool:
    try:
        descriptor = os.open(root / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False  # not one of ours as we make them: leave it
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # its process lives
    finally:
        os.close(descriptor)  # releases the lock if taken
    return True
