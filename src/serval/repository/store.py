"""Versions as immutable snapshots: atomic publish with a checksum manifest, history, rollback.

A version folder is written under a hidden temporary name, then renamed into place, so a server
never sees half a version. `serving.json` beside the versions pins the version that serves;
rollback rewrites it atomically, so it survives restarts.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from serval.errors import ConfigError

MANIFEST_FILE = "manifest.json"
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SERVING_FILE = "serving.json"


@dataclass(frozen=True, slots=True)
class VersionRecord:
    """One published version as its manifest describes it."""

    version: str
    created_at: str
    source: str
    files: dict[str, str]  # relative path -> sha256
    serving: bool
    pinned: bool = False  # serving because serving.json pins it (a rollback), not as latest
    manifest: bool = True  # published with a manifest (verify has something to check)


def check_model_name(model: str) -> str:
    """Model names become folder names: letters, digits, '.', '_', '-', not starting with '.'."""
    if not MODEL_NAME.fullmatch(model):
        raise ConfigError(f"model name {model!r} is not allowed: use letters, digits, '.', "
                          "'_' and '-', starting with a letter or digit")
    return model


def publish(source: Path, repository: Path, model: str, *, note: str = "",
            report: dict[str, Any] | None = None, create: bool = True) -> str:
    """Copy a model file (or folder) in as the next version; returns the new version. A
    missing repository folder is created only with CREATE (`repo publish` asks for --create:
    a mistyped path is not a new repository)."""
    check_model_name(model)
    check_publishable(source)
    if not create and not repository.is_dir():
        raise ConfigError(f"{repository}: model repository directory not found (--create "
                          "makes a new one)")
    model_dir = repository / model
    model_dir.mkdir(parents=True, exist_ok=True)
    staging = model_dir / f".publish-{uuid.uuid4().hex}"
    try:
        if source.is_dir():
            shutil.copytree(source, staging)
        else:
            staging.mkdir()
            shutil.copy2(source, staging / source.name)
        write_json(staging / MANIFEST_FILE, {
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "source": note or str(source), "files": checksums(staging), "report": report,
        })
        return _rename_as_next_version(staging, model_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_publishable(source: Path) -> None:
    """A file with bytes in it, or a folder holding at least one: else ConfigError (an empty
    version would serve and fail to load)."""
    if not source.exists():
        raise ConfigError(f"{source}: nothing to publish (no such file or folder)")
    if source.is_dir():
        if not any(p.is_file() and p.stat().st_size and p.name != MANIFEST_FILE
                   for p in source.rglob("*")):
            raise ConfigError(f"{source}: nothing to publish (the folder holds no model file)")
    elif not source.is_file() or source.stat().st_size == 0:
        raise ConfigError(f"{source}: nothing to publish (an empty or special file)")


def history(repository: Path, model: str) -> list[VersionRecord]:
    """Every version of a model, oldest first, with what serves marked."""
    model_dir = _model_dir(repository, model)
    serving = serving_version(model_dir)
    records = []
    for version in _versions(model_dir):
        try:
            found = read_manifest(model_dir / version)
        except ConfigError:  # a broken manifest: listed all the same, `repo verify` says why
            found = None
        manifest = found or {}
        files = manifest.get("files", {})
        records.append(VersionRecord(
            version, str(manifest.get("created_at", "")), str(manifest.get("source", "")),
            dict(files) if isinstance(files, dict) else {}, version == serving,
            version == serving, found is not None or (model_dir / version / MANIFEST_FILE
                                                      ).exists(),
        ))
    if serving is None and records:
        records[-1] = _mark_serving(records[-1])
    return records


def rollback(repository: Path, model: str, to: str | None = None) -> str:
    """Pin the given version, or the one before the serving one; returns it."""
    model_dir = _model_dir(repository, model)
    versions = _versions(model_dir)
    current = serving_version(model_dir) or (versions[-1] if versions else None)
    if to is None:
        older = [v for v in versions if current is not None and int(v) < int(current)]
        if not older:
            raise ConfigError(f"model '{model}': no version older than {current} to roll back to")
        to = older[-1]
    if to not in versions:
        raise ConfigError(f"model '{model}' has no version {to}; versions: {', '.join(versions)}")
    problems = verify_version(model_dir / to)
    if problems:
        raise ConfigError(f"model '{model}' version {to} is corrupted: {problems[0]}")
    write_json(model_dir / SERVING_FILE, {"version": to})
    return to


def unpin(repository: Path, model: str) -> str | None:
    """Release a rollback's pin: the latest version serves again; the version that was
    pinned (None when none was)."""
    model_dir = _model_dir(repository, model)
    pinned = serving_version(model_dir)
    if pinned is not None:
        (model_dir / SERVING_FILE).unlink()
    return pinned


def latest_version(repository: Path, model: str) -> str | None:
    versions = _versions(_model_dir(repository, model))
    return versions[-1] if versions else None


def pinned_version(repository: Path, model: str) -> str | None:
    """The version a rollback pinned, if any (a model not published yet has none)."""
    model_dir = repository / model
    return serving_version(model_dir) if model_dir.is_dir() else None


def serving_version(model_dir: Path) -> str | None:
    """The pinned version, if serving.json pins one."""
    path = model_dir / SERVING_FILE
    if not path.is_file():
        return None
    try:
        version = orjson.loads(path.read_bytes()).get("version")
    except (orjson.JSONDecodeError, AttributeError):
        raise ConfigError(f"{path}: not a JSON object like {{\"version\": \"3\"}}") from None
    return str(version) if version is not None else None


def verify_version(version_dir: Path) -> list[str]:
    """Mismatches between a version's files and its manifest (no manifest: nothing to check);
    a manifest that does not read is a problem too."""
    try:
        manifest = read_manifest(version_dir)
    except ConfigError as exc:
        return [str(exc).removeprefix(f"{version_dir}/")]
    if manifest is None:
        return []
    expected = manifest.get("files", {})
    if not isinstance(expected, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in expected.items()):
        return [f"{MANIFEST_FILE}: 'files' is not an object of file names to checksums"]
    actual = checksums(version_dir)
    problems = [f"{name}: checksum mismatch" for name, digest in expected.items()
                if actual.get(name) != digest]
    problems += [f"{name}: missing" for name in expected if name not in actual]
    return sorted(set(problems))


def read_manifest(version_dir: Path) -> dict[str, Any] | None:
    path = version_dir / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError:
        raise ConfigError(f"{path}: not valid JSON") from None
    if not isinstance(manifest, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return manifest


def checksums(folder: Path) -> dict[str, str]:
    """sha256 of every file below folder except the manifest, by relative path."""
    digests = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != MANIFEST_FILE:
            digest = hashlib.sha256()
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            digests[str(path.relative_to(folder))] = digest.hexdigest()
    return digests


def _rename_as_next_version(staging: Path, model_dir: Path) -> str:
    for _ in range(100):  # another publisher may take a number first: try the next one
        existing = _versions(model_dir)
        version = str(int(existing[-1]) + 1) if existing else "1"
        try:
            os.rename(staging, model_dir / version)
            return version
        except OSError:
            continue
    raise ConfigError(f"{model_dir}: could not find a free version number")


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write a JSON document atomically (a reader sees the old one or the new one)."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    temporary.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    with temporary.open("rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _model_dir(repository: Path, model: str) -> Path:
    path = repository / check_model_name(model)
    if not path.is_dir():
        raise ConfigError(f"{path}: no such model in the repository")
    return path


def is_version_name(name: str) -> bool:
    """Whether a folder name is a version: ASCII digits only, as Triton reads them (a
    superscript '²' or an Arabic-Indic '٣' is a folder like any other, not a version)."""
    return name.isascii() and name.isdigit()


def _versions(model_dir: Path) -> list[str]:
    return sorted((p.name for p in model_dir.iterdir() if p.is_dir() and is_version_name(p.name)),
                  key=int)


def _mark_serving(record: VersionRecord) -> VersionRecord:
    return VersionRecord(record.version, record.created_at, record.source, record.files, True,
                         False, record.manifest)
