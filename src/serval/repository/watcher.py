"""Polls the repository so a running server picks up publishes, rollbacks and config edits."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from serval.errors import ModelNotReady, ServalError
from serval.repository.data_files import DATA_FOLDERS
from serval.repository.layout import is_model_folder
from serval.repository.registry import ModelRegistry
from serval.repository.served import ModelState
from serval.repository.store import is_version_name

log = logging.getLogger(__name__)

Signature = tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]
CLOCK_SLACK_NS = 1_000_000_000  # file times may lag the wall clock (a coarse kernel clock)


def model_signature(model_dir: Path) -> Signature:
    """What a reload depends on, cheaply, as Triton's poll: each version folder with the
    latest modification time of anything in it (a file added, renamed in or rewritten in
    place), the model folder's own files with theirs (config.yaml, config.pbtxt, labels,
    serving.json), and its data folders (warmup/, initial_state/) as its version folders.
    registry.load then reloads what changed (each served version's files
    compared with those it loaded)."""
    versions, files = [], []
    with os.scandir(model_dir) as entries:
        for entry in entries:
            if is_version_name(entry.name) and entry.is_dir(follow_symlinks=False):
                versions.append((entry.name, _latest_ns(entry)))
            elif entry.name in DATA_FOLDERS and entry.is_dir(follow_symlinks=False):
                files.append((entry.name, _latest_ns(entry)))
            elif not entry.name.startswith(".") and _is_file(entry):
                files.append((entry.name, _mtime_ns(entry)))
    return tuple(sorted(versions)), tuple(sorted(files))


async def watch_repository(registry: ModelRegistry, interval_s: float) -> None:
    """Reload (hot swap) every model whose folder changed since the last look (or whose last
    reload found no room under the memory budget); runs forever.
    Each look runs on a thread: with 10,000 models it takes about 0.3 s of file system calls,
    which the event loop must not wait for."""
    # A folder changed after start() began reading the repository may have been loaded as it
    # was before: the first look counts it as not seen yet, so it reloads (a no-op if not).
    since_ns = registry.indexed_ns - CLOCK_SLACK_NS
    seen = {name: signature for name, signature in (await _look(registry.root, {})).items()
            if _newest_ns(signature) < since_ns}
    while True:
        await asyncio.sleep(interval_s)
        current = await _look(registry.root, seen)
        retry = set()
        for name, signature in current.items():
            if seen.get(name) != signature and _tracked_or_eager(registry, name):
                try:
                    await registry.load(name)
                    log.info("model reloaded from the repository", extra={"model": name})
                except ModelNotReady as exc:  # no room now: not the files' fault, try again
                    retry.add(name)
                    log.warning("reload found no room; the next look tries again",
                                extra={"model": name, "reason": exc.message})
                except ServalError as exc:
                    log.error("reload failed; serving versions keep serving",
                              extra={"model": name, "reason": exc.message})
        seen = {name: signature for name, signature in current.items() if name not in retry}


def _newest_ns(signature: Signature) -> int:
    return max((ns for entries in signature for _, ns in entries), default=0)


def _tracked_or_eager(registry: ModelRegistry, name: str) -> bool:
    """Reload under control 'all', or a lazy model that has been loaded (even if evicted since)."""
    if registry.control == "all" or registry.ready_versions(name):
        return True
    return any(registry.get(name, v).state is ModelState.EVICTED
               for v in registry.versions_of(name))


async def _look(root: Path, seen: dict[str, Signature]) -> dict[str, Signature]:
    """One look at the repository, or (its folder unreadable) the last one: the poll goes on."""
    try:
        return await asyncio.to_thread(_signatures, root)
    except OSError as exc:
        log.error("the repository could not be read; the poll tries again",
                  extra={"reason": exc.strerror or type(exc).__name__})
        return seen


def _signatures(root: Path) -> dict[str, Signature]:
    """Each model folder's signature; a folder that vanishes or cannot be read while looking
    is left out of this look (its served versions keep serving)."""
    found = {}
    for path in root.iterdir():
        if is_model_folder(path):
            try:
                found[path.name] = model_signature(path)
            except OSError:
                continue
    return found


def _mtime_ns(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat().st_mtime_ns
    except OSError:  # gone while looking, a dangling or looping link: no time of its own
        return 0


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()
    except OSError:  # a link that loops: not a file a model reads
        return False


def _latest_ns(folder: os.DirEntry[str]) -> int:
    """The latest modification time of a folder and of everything under it."""
    latest = _mtime_ns(folder)
    try:
        with os.scandir(folder.path) as entries:
            for entry in entries:
                latest = max(latest, _latest_ns(entry) if entry.is_dir(follow_symlinks=False)
                             else _mtime_ns(entry))
    except OSError:  # gone while looking, or unreadable: what was seen of it counts
        pass
    return latest
