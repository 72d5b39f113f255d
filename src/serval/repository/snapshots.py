"""Repository snapshots: which version of every model serves, recorded under a name, and
restored in one command (every model pinned back to its recorded version).

A snapshot is `.snapshots/<name>.json` in the repository (hidden: never a model), written
atomically. Versions are immutable (store.py), so a snapshot needs only their numbers; restore
refuses a snapshot whose versions are gone or no longer match their manifests, before it pins
anything. Models published after the snapshot are not in it and keep what they serve.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from serval.errors import ConfigError
from serval.repository import store

SNAPSHOTS_DIR = ".snapshots"


@dataclass(frozen=True, slots=True)
class Snapshot:
    name: str
    created_at: str
    models: dict[str, str]  # model -> the version that served


def take(repository: Path, name: str | None = None) -> Snapshot:
    """Record the serving version of every published model (pinned, or else the latest)."""
    models = {}
    for model_dir in sorted(p for p in _checked_repository(repository).iterdir()
                            if p.is_dir() and not p.name.startswith((".", "_"))):
        records = store.history(repository, model_dir.name)
        serving = next((r.version for r in records if r.serving), None)
        if serving is not None:
            models[model_dir.name] = serving
    if not models:
        raise ConfigError(f"{repository}: no published model to snapshot")
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    name = name or time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = _path(repository, name)
    if path.exists():
        raise ConfigError(f"snapshot '{name}' exists; choose another name")
    path.parent.mkdir(exist_ok=True)
    store.write_json(path, {"created_at": created, "models": models})
    return Snapshot(name, created, models)


def listing(repository: Path) -> list[Snapshot]:
    """Every snapshot, oldest first."""
    folder = _checked_repository(repository) / SNAPSHOTS_DIR
    found = [_read(repository, p.stem) for p in folder.glob("*.json")] if folder.is_dir() else []
    return sorted(found, key=lambda s: (s.created_at, s.name))


def restore(repository: Path, name: str) -> Snapshot:
    """Pin every model of the snapshot to its recorded version; nothing is pinned unless every
    recorded version is still there and intact."""
    snapshot = _read(repository, name)
    for model, version in snapshot.models.items():
        version_dir = repository / model / version
        if not version_dir.is_dir():
            raise ConfigError(f"snapshot '{name}': model '{model}' version {version} is gone; "
                              "nothing was restored")
        problems = store.verify_version(version_dir)
        if problems:
            raise ConfigError(f"snapshot '{name}': model '{model}' version {version} is "
                              f"corrupted ({problems[0]}); nothing was restored")
    for model, version in snapshot.models.items():
        store.rollback(repository, model, version)
    return snapshot


def _read(repository: Path, name: str) -> Snapshot:
    path = _path(_checked_repository(repository), name)
    try:
        doc = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise ConfigError(f"no snapshot '{name}' (`serval repo snapshots` lists them)") from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"snapshot '{name}' cannot be read: {exc}") from None
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and store.is_version_name(v)
            for k, v in models.items()):
        raise ConfigError(f"snapshot '{name}' is not a snapshot file (no models and versions)")
    for model in models:
        store.check_model_name(model)
    return Snapshot(name, str(doc.get("created_at", "")), models)


def _path(repository: Path, name: str) -> Path:
    if not store.MODEL_NAME.fullmatch(name):
        raise ConfigError(f"snapshot name {name!r} is not allowed: use letters, digits, '.', "
                          "'_' and '-', starting with a letter or digit")
    return repository / SNAPSHOTS_DIR / f"{name}.json"


def _checked_repository(repository: Path) -> Path:
    if not repository.is_dir():
        raise ConfigError(f"{repository}: model repository directory not found")
    return repository
