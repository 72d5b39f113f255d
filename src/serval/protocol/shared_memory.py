"""Triton's system shared-memory regions: named windows onto POSIX shared-memory objects
(`/dev/shm/<key>`) that clients create and register. The registry maps each region once, hands
out read-only views of its bytes and writes into it, every bound checked, and releases every
mapping on unregister and at close. Each region keeps its object's descriptor, to check before
every use that the client has not shrunk the object (a read past its end would kill the server
with SIGBUS); the descriptor is closed on unregister."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serval.errors import InvalidInput

SHM_ROOT = Path("/dev/shm")  # where shm_open(3) keeps its objects on Linux
MAX_REGIONS = 256  # each holds two descriptors: ours and the duplicate Python's mmap keeps
MAX_NAME_CHARS = 255
MAX_KEY_BYTES = 255  # NAME_MAX: a key is one file name under SHM_ROOT
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


@dataclass(frozen=True, slots=True)
class RegionStatus:
    """One registered region as Triton's status lists it."""

    name: str
    key: str
    offset: int
    byte_size: int

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}


@dataclass(slots=True)
class _Region:
    status: RegionStatus
    mapping: mmap.mmap
    start: int  # where the region begins inside the mapping (mappings start page-aligned)
    fd: int  # the object, for its current size

    def check_size(self) -> None:
        """InvalidInput when the object no longer covers the region (a client truncated it)."""
        status = self.status
        size = os.fstat(self.fd).st_size
        if size < status.offset + status.byte_size:
            raise InvalidInput(
                f"shared memory region '{status.name}': its object ('{status.key[:80]}') now "
                f"has {size} bytes, fewer than offset {status.offset} + byte_size "
                f"{status.byte_size} as registered; unregister it and register it again")


class SharedMemoryRegistry:
    """The server's registered regions, by name (one namespace, as Triton's)."""

    def __init__(self, root: Path = SHM_ROOT, max_regions: int = MAX_REGIONS) -> None:
        self.root = root
        self.max_regions = max_regions
        self._regions: dict[str, _Region] = {}

    def __len__(self) -> int:
        return len(self._regions)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map `byte_size` bytes at `offset` of the object `key` under `name`; InvalidInput
        names what was wrong (a duplicate name, a bad key, bounds past the object's end)."""
        _check_name(name)
        _check_int(offset, "offset", 0)
        _check_int(byte_size, "byte_size", 1)
        if name in self._regions:
            raise InvalidInput(f"shared memory region '{name}' is already registered; "
                               "unregister it first or choose another name")
        if len(self._regions) >= self.max_regions:
            raise InvalidInput(f"this server holds at most {self.max_regions} shared memory "
                               "regions; unregister one first")
        fd = _open(self.root, key)
        try:
            mapping, start = _map(fd, key, offset, byte_size)
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = _Region(RegionStatus(name, key, offset, byte_size), mapping,
                                      start, fd)

    def unregister(self, name: str | None = None) -> int:
        """Forget one region (nothing to do when it is not registered, as Triton), or all;
        how many were released."""
        names = list(self._regions) if not name else [name]
        released = 0
        for each in names:
            region = self._regions.pop(each, None)
            if region is not None:
                os.close(region.fd)
                _release(region.mapping)
                released += 1
        return released

    def close(self) -> int:
        """Release every mapping (at server shutdown); how many there were."""
        return self.unregister()

    def status(self, name: str | None = None) -> list[RegionStatus]:
        """Every region, or the one named (InvalidInput when it is not registered)."""
        if not name:
            return [region.status for region in self._regions.values()]
        return [self._get(name).status]

    def view(self, name: str, offset: int, byte_size: int, what: str) -> memoryview:
        """A read-only view of `byte_size` bytes at `offset` in the region (no copy). The
        mapping outlives an unregister while a view of it is alive (Python refuses to unmap
        exported memory), so a request in flight never reads unmapped memory."""
        region, start = self._locate(name, offset, byte_size, what)
        return memoryview(region.mapping)[start:start + byte_size].toreadonly()

    def write(self, name: str, offset: int, byte_size: int, data: memoryview, what: str) -> None:
        """Copy `data` into the region at `offset`; it must fit in `byte_size` bytes."""
        region, start = self._locate(name, offset, byte_size, what)
        if data.nbytes > byte_size:
            raise InvalidInput(f"{what} needs {data.nbytes} bytes; shared_memory_byte_size is "
                               f"{byte_size} (region '{name}')")
        region.mapping[start:start + data.nbytes] = data

    def check(self, name: str, offset: int, byte_size: int, what: str) -> None:
        """InvalidInput unless the window lies inside a registered region."""
        self._locate(name, offset, byte_size, what)

    def _get(self, name: str) -> _Region:
        region = self._regions.get(name)
        if region is None:
            raise InvalidInput(f"Unable to find system shared memory region: '{name[:80]}'")
        return region

    def _locate(self, name: str, offset: int, byte_size: int, what: str) -> tuple[_Region, int]:
        region = self._get(name)
        region.check_size()
        size = region.status.byte_size
        if offset + byte_size > size:
            raise InvalidInput(
                f"{what}: shared_memory_offset {offset} + shared_memory_byte_size {byte_size} "
                f"runs past the end of region '{name}' ({size} bytes)")
        return region, region.start + offset


def object_name(key: str) -> str:
    """The file name a key stands for under the shm root ("/name" or "name"), or InvalidInput:
    one path component only, never '.', '..', empty, NUL or over NAME_MAX bytes."""
    if not isinstance(key, str):
        raise InvalidInput("shared memory 'key' must be a string such as \"/my_region\"")
    name = key[1:] if key.startswith("/") else key
    shown = key[:80]
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise InvalidInput(f"shared memory key '{shown}' is not valid: it must be one name, "
                           "with one optional leading '/' (as shm_open takes it), and no other "
                           "'/', NUL, '.' or '..'")
    if len(name.encode("utf-8", errors="surrogatepass")) > MAX_KEY_BYTES:
        raise InvalidInput(f"shared memory key '{shown}...' is longer than {MAX_KEY_BYTES} bytes")
    return name


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidInput("a shared memory region needs a non-empty name")
    if len(name) > MAX_NAME_CHARS or "\0" in name:
        raise InvalidInput(f"shared memory region name '{name[:80]}' must be at most "
                           f"{MAX_NAME_CHARS} characters, without NUL")


def _check_int(value: Any, field: str, least: int) -> None:
    if type(value) is not int or value < least:
        raise InvalidInput(f"shared memory '{field}' must be an integer of at least {least}, "
                           f"got {str(value)[:40]}")


def _map(fd: int, key: str, offset: int, byte_size: int) -> tuple[mmap.mmap, int]:
    """Check the object is a file that holds the window; map the window."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInput(f"shared memory key '{key[:80]}' is not a shared memory object "
                           "(not a regular file)")
    if offset + byte_size > info.st_size:
        raise InvalidInput(
            f"shared memory key '{key[:80]}': offset {offset} + byte_size {byte_size} runs "
            f"past the end of the object ({info.st_size} bytes)")
    aligned = offset - offset % mmap.ALLOCATIONGRANULARITY
    try:
        mapping = mmap.mmap(fd, offset + byte_size - aligned, mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE, offset=aligned)
    except OSError as exc:
        raise InvalidInput(f"shared memory key '{key[:80]}' cannot be mapped: "
                           f"{exc.strerror}") from None
    return mapping, offset - aligned


def _open(root: Path, key: str) -> int:
    name = object_name(key)
    directory = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return os.open(name, _OPEN_FLAGS, dir_fd=directory)
    except FileNotFoundError:
        raise InvalidInput(f"shared memory key '{key[:80]}' names no object; create it "
                           "(shm_open) before registering it") from None
    except PermissionError:
        raise InvalidInput(f"shared memory key '{key[:80]}': this server may not read and "
                           "write that object (its permissions)") from None
    except OSError as exc:  # ELOOP: a symbolic link; others as the system words them
        why = ("is a symbolic link" if exc.errno == errno.ELOOP
               else f"cannot be opened: {exc.strerror}")
        raise InvalidInput(f"shared memory key '{key[:80]}' {why}") from None
    finally:
        os.close(directory)


def _release(mapping: mmap.mmap) -> None:
    """Unmap now, or, while a request still holds a view, when its last view goes."""
    with contextlib.suppress(BufferError):  # exported: unmapped when its last view is released
        mapping.close()
