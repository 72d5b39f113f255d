"""A client's load override (Triton's `load_model(config=, files=)`): a config in Serval's
config.yaml form (laid over the folder's) or Triton's JSON form (replacing it), and files written
to a private folder that stands in for the model's folder while the override is in force."""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from serval.backends.base import ModelVersionSpec
from serval.config import TransportLimits
from serval.errors import ConfigError, InvalidInput, LoadFailed, ModelNotFound, ModelNotReady
from serval.model_config import MAX_CONFIG_BYTES, ModelConfig
from serval.protocol.grpc import model_config_pb2 as mc
from serval.repository.layout import ModelDirectory, scan_model
from serval.repository.scratch import private_folder
from serval.repository.store import serving_version
from serval.repository.triton_config import parse_json, to_model_config

CONFIG_SOURCE = "parameter 'config'"
FILE_PREFIX = "file:"
MAX_FILES = 1024  # files in one override
MAX_FILES_BYTES = TransportLimits.max_request_bytes  # default bound: the largest request body
_MAX_PATH_BYTES = 1024
_MAX_NAME_BYTES = 255  # one file or folder name (NAME_MAX on Linux and most file systems)
# Why writing a checked file can still fail because of what the client asked for (a name this
# file system refuses): a 400. Any other error is the server's (its disk full): a 503.
_CLIENTS_ERRNOS = {
    errno.ENAMETOOLONG: "a file name or path is too long for the server's file system",
    errno.EINVAL: "a file name is not valid on the server's file system",
    errno.EILSEQ: "a file name is not valid on the server's file system",
    errno.EEXIST: "two file parameters name the same file on the server's file system",
    errno.ENOTDIR: "a file parameter puts a file inside another file",
    errno.EISDIR: "a file parameter names a folder that another puts files in",
}
_MAX_SHOWN = 80  # how much of a client's parameter name an error quotes
_SETTINGS = frozenset(ModelConfig.model_fields)
_TRITON = frozenset(name for field in mc.ModelConfig.DESCRIPTOR.fields
                    for name in (field.name, field.json_name))


@dataclass(frozen=True, slots=True)
class LoadOverride:
    """What a load request overrides: `settings` (config.yaml form) or `triton` (Triton's JSON
    form), and `folder`, the files written out (<private temp>/<name>; None: the repository's)."""

    settings: dict[str, object] | None = None
    triton: mc.ModelConfig | None = None
    folder: Path | None = None

    def directory(self, root: Path, name: str) -> ModelDirectory | None:
        """The folder this override loads from: its files, else the repository's."""
        if self.folder is None:
            return scan_model(root, name)
        return scan_model(self.folder.parent, name)

    def config(self, directory: ModelDirectory) -> ModelConfig:
        if self.triton is not None:
            return to_model_config(self.triton, directory.path, CONFIG_SOURCE)
        return directory.config(self.settings)

    def source(self, config_file: str) -> str:
        """Where the settings of a version loaded under this override came from, for errors
        (the folder's config file is not all of it, or none of it)."""
        if self.triton is not None:
            return CONFIG_SOURCE
        return f"{config_file} with {CONFIG_SOURCE} over it" if self.settings else config_file

    def problem(self, directory: ModelDirectory) -> str | None:
        """What is wrong with the override itself (None: nothing; a broken folder config of
        its own is not the override's problem: the load reports it)."""
        if self.triton is None:
            try:
                directory.config()
            except ConfigError:
                return None
        try:
            self.config(directory)
        except ConfigError as exc:
            return str(exc).split(": ", 1)[-1]
        return None

    def discard(self) -> None:
        """Remove the private folder (once no version loaded from it is served)."""
        if self.folder is not None:
            shutil.rmtree(self.folder.parent, ignore_errors=True)


def model_directory(root: Path, name: str, override: LoadOverride | None
                    ) -> ModelDirectory | None:
    return override.directory(root, name) if override else scan_model(root, name)


def version_spec(directory: ModelDirectory, version: str, override: LoadOverride | None
                 ) -> ModelVersionSpec:
    if override is None:
        return directory.version_spec(version)
    if version not in directory.versions:
        raise ConfigError(f"{directory.path}: has no version {version}")
    return ModelVersionSpec(directory.name, version, directory.path / version,
                            override.config(directory))


def reload_plan(root: Path, name: str, override: LoadOverride | None,
                public: Callable[[str], str]) -> tuple[ModelDirectory, tuple[str, ...]]:
    """The folder a reload loads from and the versions it selects (serving.json's pin, else
    the policy). ModelNotFound; InvalidInput for the override's fault, LoadFailed for the
    folder's, each reason as `public` shows it to clients."""
    directory = model_directory(root, name, override)
    if directory is None:
        raise ModelNotFound(f"failed to load '{name}': no model '{name}' in the repository")
    problem = override.problem(directory) if override else None
    if problem:
        raise InvalidInput(f"failed to load '{name}': parameter 'config' is not valid for "
                           f"model '{name}': {public(problem)}")
    try:
        pinned = serving_version(directory.path)
        config = override.config(directory) if override else directory.config()
    except ConfigError as exc:
        raise LoadFailed(f"failed to load '{name}': {public(str(exc))}") from None
    selected = (pinned,) if pinned in directory.versions else config.version_policy.select(
        directory.versions)
    if not selected:
        raise LoadFailed(f"failed to load '{name}': the version policy selects no version "
                         "folder (e.g. 1/)")
    return directory, selected


def prepare_override(name: str, config: dict[str, Any] | None, files: Mapping[str, bytes],
                     max_bytes: int = MAX_FILES_BYTES) -> LoadOverride | None:
    """The override a load request asks for (None: none), its files written to a private
    folder; InvalidInput naming what the client got wrong. Blocking: run it off the loop."""
    if config is None and not files:
        return None
    if config is None:
        raise InvalidInput(f"failed to load '{name}': parameter 'config' must accompany "
                           "'file:' parameters (as in Triton: the files replace the model's "
                           "folder, so the config must be given)")
    size = len(json.dumps(config, separators=(",", ":")))
    if size > MAX_CONFIG_BYTES:  # as a config file: it is read on the event loop
        raise InvalidInput(f"failed to load '{name}': parameter 'config' holds {size} bytes of "
                           f"JSON; a model config may hold at most {MAX_CONFIG_BYTES}")
    settings, triton = config_form(name, config)
    check_no_server_files(name, settings, triton)
    folder = write_files(name, check_files(name, files, max_bytes)) if files else None
    return LoadOverride(settings, triton, folder)


def config_form(name: str, config: dict[str, Any]
                ) -> tuple[dict[str, object] | None, mc.ModelConfig | None]:
    """(settings, None) for Serval's config.yaml form, (None, parsed) for Triton's JSON form
    (what get_model_config answers). Keys both forms know (max_batch_size, backend, ...) are
    read as Serval's unless only Triton's reading of them is valid."""
    keys = set(config)
    if keys <= _SETTINGS:
        try:
            ModelConfig.model_validate(config)
            return config, None
        except ValidationError:
            if not keys <= _TRITON:
                return config, None  # reported with the folder's config, as a field problem
            try:
                return None, parse_json(config, CONFIG_SOURCE)
            except ConfigError:
                return config, None  # Serval's reading names the field more plainly
    try:
        return None, parse_json(config, CONFIG_SOURCE)
    except ConfigError as exc:
        raise InvalidInput(f"failed to load '{name}': {exc} (give Triton's JSON form of a "
                           "model config, or config.yaml settings)") from None


_FILE_WORDS = ("path", "file", "lib", "table_name", "prefix")  # option keys that name files


def check_no_server_files(name: str, settings: dict[str, object] | None,
                          triton: mc.ModelConfig | None) -> None:
    """InvalidInput for engine settings that would make the server read or write files it
    names (engine caches, plugin libraries, dumps): a network client may not choose them, as
    it may not choose the log file; they belong in the model's config in the repository."""
    named: list[str] = []
    engine = settings.get("onnxruntime") if settings else None
    if isinstance(engine, dict):
        named += [f"onnxruntime.{key}" for key in ("session_entries", "run_entries")
                  if engine.get(key)]
        for provider in engine.get("execution_providers") or []:
            if isinstance(provider, (list, tuple)) and len(provider) == 2 and isinstance(
                    provider[1], dict):
                named += [f"onnxruntime.execution_providers {provider[0]} option '{key}'"
                          for key in provider[1] if any(w in str(key) for w in _FILE_WORDS)]
    if triton is not None:
        for accelerator in triton.optimization.execution_accelerators.gpu_execution_accelerator:
            named += [f"optimization.execution_accelerators {accelerator.name} parameter "
                      f"'{key}'" for key in accelerator.parameters
                      if any(word in key for word in _FILE_WORDS)]
    if named:
        raise InvalidInput(f"failed to load '{name}': {named[0][:_MAX_SHOWN * 2]} may name "
                           "files on the server, which a load request may not set (put it in "
                           "the model's config in the repository)")


def check_files(name: str, files: Mapping[str, bytes], max_bytes: int
                ) -> dict[PurePosixPath, bytes]:
    """Each `file:<path>` as a path inside the model's folder; InvalidInput for a path that
    would leave it, too many files or bytes, or a file where another needs a folder."""
    if name.startswith((".", "_")):
        raise InvalidInput(f"failed to load '{name}': a model loaded from files needs a name "
                           "that does not start with '.' or '_'")
    if len(files) > MAX_FILES:
        raise InvalidInput(f"failed to load '{name}': {len(files)} files given; at most "
                           f"{MAX_FILES}")
    total = sum(len(content) for content in files.values())
    if total > max_bytes:
        raise InvalidInput(f"failed to load '{name}': the files hold {total} bytes; at most "
                           f"{max_bytes} (the server's request size limit)")
    checked = {_relative_path(name, key): content for key, content in files.items()}
    folders = {parent for path in checked for parent in path.parents}
    for path in checked:
        if path in folders:
            raise InvalidInput(f"failed to load '{name}': parameter '{FILE_PREFIX}{path}' is a "
                               "file, and another parameter puts files inside it")
    return checked


def _relative_path(name: str, key: str) -> PurePosixPath:
    shown = key if len(key) <= _MAX_SHOWN else f"{key[:_MAX_SHOWN]}..."
    where = f"failed to load '{name}': parameter {shown!r}"
    if not key.startswith(FILE_PREFIX):
        raise InvalidInput(f"{where}: a file parameter is named 'file:<version>/<path>'")
    raw = key[len(FILE_PREFIX):]
    if not raw or raw.startswith("/") or "\\" in raw or "\x00" in raw or ":" in raw:
        raise InvalidInput(f"{where}: the path must be relative to the model's folder, "
                           "e.g. 'file:1/model.onnx' (no leading '/', '\\', ':' or NUL)")
    parts = raw.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise InvalidInput(f"{where}: the path may not contain '..', '.' or empty parts; it "
                           "must stay inside the model's folder")
    if len(raw.encode("utf-8", "surrogatepass")) > _MAX_PATH_BYTES:
        raise InvalidInput(f"{where}: the path is longer than {_MAX_PATH_BYTES} bytes")
    for part in parts:
        if len(part.encode("utf-8", "surrogatepass")) > _MAX_NAME_BYTES:
            raise InvalidInput(f"{where}: a file or folder name in the path is longer than "
                               f"{_MAX_NAME_BYTES} bytes, the most a file system allows")
    return PurePosixPath(*parts)


def write_files(name: str, files: Mapping[PurePosixPath, bytes]) -> Path:
    """Write checked files under a new private folder (0700, repository/scratch.py); returns
    <it>/<name>. Nothing there is a link, and files are opened without following one."""
    root = private_folder()
    folder = root / name
    try:
        folder.mkdir()
        for relative, content in files.items():
            target = folder.joinpath(*relative.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            with os.fdopen(os.open(target, flags, 0o600), "wb") as handle:
                handle.write(content)
    except UnicodeError:
        shutil.rmtree(root, ignore_errors=True)
        raise InvalidInput(f"failed to load '{name}': a file path is not valid Unicode "
                           "text") from None
    except OSError as exc:
        shutil.rmtree(root, ignore_errors=True)
        if exc.errno in _CLIENTS_ERRNOS:
            raise InvalidInput(f"failed to load '{name}': its files could not be written: "
                               f"{_CLIENTS_ERRNOS[exc.errno]}") from None
        # the server's disk (full, read-only, failing), not the client's request
        raise ModelNotReady(f"failed to load '{name}': its files could not be written: "
                            f"{exc.strerror or exc}") from None
    return folder
