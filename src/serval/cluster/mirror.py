"""A local read-only mirror of a remote (fsspec URL) repository, kept in step by polling.

Version folders are immutable once published, so each is copied once (into a temporary folder,
then renamed into place); the small mutable files (serving.json, config.yaml) are fetched on
every sync and rewritten only when their bytes change, so the repository watcher sees a changed
modification time exactly when a publish or rollback happened.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from serval.errors import ConfigError
from serval.repository.store import is_version_name

log = logging.getLogger(__name__)

MUTABLE_FILES = ("serving.json", "config.yaml")


class RepositoryMirror:
    """Copies `url` (any fsspec protocol) into `local_root` and refreshes it on sync()."""

    def __init__(self, url: str, local_root: Path) -> None:
        try:
            import fsspec
        except ImportError:
            raise ConfigError(
                f"repository {url!r} is a URL: install fsspec "
                "(pip install 'serval-server[ray]')"
            ) from None
        try:
            self._fs, self._root = fsspec.core.url_to_fs(url)
        except (ValueError, ImportError) as exc:
            raise ConfigError(f"repository {url!r}: {exc}") from None
        self.url = url
        self.local_root = local_root
        local_root.mkdir(parents=True, exist_ok=True)

    def sync(self) -> int:
        """Bring the mirror up to date; returns how many files or folders were copied."""
        copied = 0
        for model_path in self._dirs(self._root):
            name = model_path.rstrip("/").rsplit("/", 1)[-1]
            if name.startswith((".", "_")):
                continue
            copied += self._sync_model(model_path, self.local_root / name)
        return copied

    def _sync_model(self, remote: str, local: Path) -> int:
        local.mkdir(exist_ok=True)
        copied = 0
        for entry in self._fs.ls(remote, detail=True):
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if (entry["type"] == "directory" and is_version_name(name)
                    and not (local / name).exists()):
                self._copy_version(entry["name"], local / name)
                copied += 1
            elif entry["type"] == "file" and name in MUTABLE_FILES:
                copied += _write_if_changed(local / name, self._fs.cat_file(entry["name"]))
        return copied

    def _copy_version(self, remote: str, target: Path) -> None:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            self._fs.get(remote.rstrip("/") + "/", str(staging), recursive=True)
            os.replace(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        log.info("mirrored a model version", extra={"path": str(target)})

    def _dirs(self, path: str) -> list[str]:
        entries: list[dict[str, Any]] = self._fs.ls(path, detail=True)
        return [e["name"] for e in entries if e["type"] == "directory"]


def _write_if_changed(path: Path, data: bytes) -> int:
    if path.exists() and path.read_bytes() == data:
        return 0
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_bytes(data)
    os.replace(staging, path)
    return 1
