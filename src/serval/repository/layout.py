"""Reads a Triton-shaped repository: <root>/<model>/config.pbtxt or config.yaml (config.pbtxt wins
when both are there: see triton_config) and <root>/<model>/<version>/."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from serval.backends.base import ModelVersionSpec
from serval.errors import ConfigError
from serval.model_config import MODEL_CONFIG_FILE, ModelConfig, load_model_config
from serval.repository.data_files import DATA_FOLDERS
from serval.repository.store import SERVING_FILE, is_version_name
from serval.repository.triton_config import PBTXT_FILE, load_pbtxt

log = logging.getLogger(__name__)
_WARNED_NAMES: set[str] = set()  # folders skipped for their name: one warning each


@dataclass(frozen=True, slots=True)
class ModelDirectory:
    """One model folder: its name and the numeric version folders found in it, oldest first."""

    name: str
    path: Path
    versions: tuple[str, ...]

    def config(self, override: dict[str, object] | None = None) -> ModelConfig:
        if (self.path / PBTXT_FILE).exists():  # a folder of that name is an error, not absent
            return load_pbtxt(self.path, override)
        return load_model_config(self.path / MODEL_CONFIG_FILE, override)

    def version_spec(self, version: str, override: dict[str, object] | None = None
                     ) -> ModelVersionSpec:
        if version not in self.versions:
            raise ConfigError(f"{self.path}: has no version {version}")
        return ModelVersionSpec(self.name, version, self.path / version, self.config(override))

    def latest_spec(self) -> ModelVersionSpec:
        if not self.versions:
            raise ConfigError(f"{self.path}: no version directory (expected e.g. {self.path}/1/)")
        return self.version_spec(self.versions[-1])


def is_model_folder(path: Path) -> bool:
    """Whether a folder of the repository is a model: not hidden or temporary, and named in
    valid UTF-8 (a model name travels in JSON, protobuf strings, logs and metric labels)."""
    return path.is_dir() and not path.name.startswith((".", "_")) and _utf8(path.name)


def scan_repository(root: Path) -> list[ModelDirectory]:
    """Every model folder under root, sorted by name; hidden and temp folders are skipped,
    and a folder whose name is not valid UTF-8 (with one warning naming it escaped)."""
    if not root.is_dir():
        raise ConfigError(f"{root}: model repository directory not found")
    models = []
    for entry in sorted(root.iterdir()):
        if is_model_folder(entry):
            models.append(ModelDirectory(entry.name, entry, _versions(entry)))
        elif entry.is_dir() and not _utf8(entry.name) and entry.name not in _WARNED_NAMES:
            _WARNED_NAMES.add(entry.name)
            log.warning("model folder skipped: its name is not valid UTF-8; rename it",
                        extra={"folder": os.fsencode(entry.name).decode("utf-8",
                                                                         "backslashreplace")})
    return models


def scan_model(root: Path, name: str) -> ModelDirectory | None:
    """One model folder as it is on disk now (None when it is gone)."""
    if not name or name.startswith((".", "_")) or "/" in name or "\\" in name:
        return None  # never a path outside the repository
    path = root / name
    if not path.is_dir():
        return None
    return ModelDirectory(name, path, _versions(path))


VersionSignature = tuple[tuple[str, int, int], ...]  # (file, size, mtime ns) of each file


def version_signature(model_dir: Path, version: str) -> VersionSignature:
    """What a loaded version was loaded from: the model folder's own files (its config, label
    files; not serving.json, which picks versions), every file of the version folder and of
    the data folders a load reads (warm-up samples, initial states). A load of a served
    version whose signature changed reloads it (as Triton's load_model)."""
    files = [f for f in model_dir.iterdir() if f.is_file() and f.name != SERVING_FILE
             and not f.name.startswith(".")]
    for folder in (model_dir / version, *(model_dir / name for name in DATA_FOLDERS)):
        if folder.is_dir():
            files += [f for f in folder.rglob("*") if f.is_file()]
    signature = []
    for path in files:
        try:
            stat = path.stat()
        except OSError:  # gone while looking, or a link that loops: the next look sees it
            continue
        signature.append((str(path.relative_to(model_dir)), stat.st_size, stat.st_mtime_ns))
    return tuple(sorted(signature))


def version_bytes(path: Path) -> int:
    """Bytes of every file in a version folder: the load's memory estimate."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _utf8(name: str) -> bool:
    try:
        name.encode("utf-8")  # undecodable bytes come back from the filesystem as surrogates
    except UnicodeEncodeError:
        return False
    return True


def _versions(model_path: Path) -> tuple[str, ...]:
    numeric = [p.name for p in model_path.iterdir() if p.is_dir() and is_version_name(p.name)]
    return tuple(sorted(numeric, key=int))
