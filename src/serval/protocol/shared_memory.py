"""Triton's system shared-memory regions: named windows onto POSIX shared-memory objects
(`/dev/shm/<key>`) that clients create and register. The registry keeps each region's object
open and reads inputs from it and writes outputs into it with pread/pwrite, every bound
checked; the descriptor is closed on unregister and at close. Nothing is mapped: a client may
shrink its object at any moment, and a read of a mapping past the object's end kills the whole
server with SIGBUS, where a read of the descriptor only comes up short (a clear 400). The cost
is one copy of each input (about 3 ms for 16 MB here), which the benchmark counts. Those
copies are request bytes the server holds: they count against the server's receive budget
(the one request bodies and gRPC messages take) until the last array made from them is freed."""

from __future__ import annotations

import errno
import os
import stat
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from serval.errors import InvalidInput, Overloaded

SHM_ROOT = Path("/dev/shm")  # where shm_open(3) keeps its objects on Linux
MAX_REGIONS = 256  # each holds its object's descriptor
MAX_REGIONS_PER_TOKEN = 64  # with auth: one client cannot take every region
MAX_NAME_CHARS = 255
MAX_KEY_BYTES = 255  # NAME_MAX: a key is one file name under SHM_ROOT
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


class Budget(Protocol):
    """Bytes of requests the server holds (server.limits.ReceiveBudget)."""

    limit_bytes: int

    def reserve(self, size_bytes: int) -> bool: ...
    def release(self, size_bytes: int) -> None: ...
    def refusal_message(self, size_bytes: int) -> str: ...


class Caller(Protocol):
    """Who asks (auth.Token): the regions it registers are its own, and another client's are
    not there for it (a 'not found', as for any name), unless it sees all (an admin). None
    for a caller: no auth on this server, every region is everyone's."""

    @property
    def owner_id(self) -> str: ...
    @property
    def sees_all(self) -> bool: ...


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
    fd: int  # the object, read and written at status.offset + a window's offset
    owner: str | None  # the registering caller's owner_id; None: registered without auth

    def reached_by(self, caller: Caller | None) -> bool:
        return caller is None or caller.sees_all or caller.owner_id == self.owner

    def check_size(self) -> None:
        """InvalidInput when the object no longer covers the region (a client truncated it):
        said before any work, rather than a short read later."""
        status = self.status
        size = os.fstat(self.fd).st_size
        if size < status.offset + status.byte_size:
            raise InvalidInput(
                f"shared memory region '{status.name}': its object ('{status.key[:80]}') now "
                f"has {size} bytes, fewer than offset {status.offset} + byte_size "
                f"{status.byte_size} as registered; unregister it and register it again")


class SharedMemoryRegistry:
    """The server's registered regions, by name (one namespace, as Triton's)."""

    def __init__(self, root: Path = SHM_ROOT, max_regions: int = MAX_REGIONS,
                 budget: Budget | None = None,
                 max_regions_per_token: int = MAX_REGIONS_PER_TOKEN) -> None:
        self.root = root
        self.max_regions = max_regions
        self.max_regions_per_token = max_regions_per_token
        self.budget = budget  # None: copies are not counted (tests, tools)
        self._regions: dict[str, _Region] = {}

    def __len__(self) -> int:
        return len(self._regions)

    def register(self, name: str, key: str, offset: int, byte_size: int,
                 caller: Caller | None = None) -> None:
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
        owner = None if caller is None else caller.owner_id
        if owner and sum(r.owner == owner for r in self._regions.values()
                         ) >= self.max_regions_per_token:
            raise InvalidInput(f"a token may hold at most {self.max_regions_per_token} shared "
                               "memory regions of this server's; unregister one first")
        fd = _open(self.root, key)
        try:
            _check_object(fd, key, offset, byte_size)
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = _Region(RegionStatus(name, key, offset, byte_size), fd, owner)

    def unregister(self, name: str | None = None, caller: Caller | None = None) -> int:
        """Forget one region (nothing to do when it is not registered, as Triton), or all
        the caller reaches; how many were released."""
        names = list(self._regions) if not name else [name]
        released = 0
        for each in names:
            region = self._regions.get(each)
            if region is not None and region.reached_by(caller):
                del self._regions[each]
                os.close(region.fd)
                released += 1
        return released

    def close(self) -> int:
        """Release every region (at server shutdown); how many there were."""
        return self.unregister()

    def status(self, name: str | None = None, caller: Caller | None = None
               ) -> list[RegionStatus]:
        """Every region the caller reaches, or the one named (InvalidInput when it is not
        registered)."""
        if not name:
            return [region.status for region in self._regions.values()
                    if region.reached_by(caller)]
        return [self._get(name, caller).status]

    def read(self, name: str, offset: int, byte_size: int, what: str,
             caller: Caller | None = None) -> memoryview:
        """A copy of `byte_size` bytes at `offset` in the region; InvalidInput when the window
        is not inside the region or the object has shrunk below it, even while reading."""
        region, start = self._locate(name, offset, byte_size, what, caller)
        data = np.empty(byte_size, dtype=np.uint8)
        self._hold(data, what)
        buffer = data.data  # keeps `data` alive, and so its hold on the budget
        done = 0
        while done < byte_size:
            got = os.preadv(region.fd, [buffer[done:]], start + done)
            if got == 0:  # shrunk since _locate looked
                region.check_size()
                raise InvalidInput(f"{what}: region '{name}' ended after {done} of "
                                   f"{byte_size} bytes")
            done += got
        return buffer

    def _hold(self, data: np.ndarray, what: str) -> None:
        """Count the copy against the budget until it is freed; 429 while the budget is full,
        400 for a copy no budget could hold."""
        if self.budget is None:
            return
        size = data.nbytes
        if size > self.budget.limit_bytes:
            raise InvalidInput(f"{what}: its {size} bytes in shared memory are more than this "
                               f"server holds of requests at once ({self.budget.limit_bytes}, "
                               "--receive-budget-mb)")
        if not self.budget.reserve(size):
            raise Overloaded(self.budget.refusal_message(size))
        weakref.finalize(data, self.budget.release, size)

    def write(self, name: str, offset: int, byte_size: int, data: memoryview, what: str,
              caller: Caller | None = None) -> None:
        """Copy `data` into the region at `offset`; it must fit in `byte_size` bytes."""
        region, start = self._locate(name, offset, byte_size, what, caller)
        if data.nbytes > byte_size:
            raise InvalidInput(f"{what} needs {data.nbytes} bytes; shared_memory_byte_size is "
                               f"{byte_size} (region '{name}')")
        flat = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        done = 0
        while done < flat.nbytes:  # a shrunk object grows back: never a fault
            done += os.pwrite(region.fd, flat[done:], start + done)

    def check(self, name: str, offset: int, byte_size: int, what: str,
              caller: Caller | None = None) -> None:
        """InvalidInput unless the window lies inside a region the caller reaches."""
        self._locate(name, offset, byte_size, what, caller)

    def _get(self, name: str, caller: Caller | None) -> _Region:
        region = self._regions.get(name)
        if region is None or not region.reached_by(caller):
            raise InvalidInput(f"Unable to find system shared memory region: '{name[:80]}'")
        return region

    def _locate(self, name: str, offset: int, byte_size: int, what: str,
                caller: Caller | None) -> tuple[_Region, int]:
        region = self._get(name, caller)
        region.check_size()
        size = region.status.byte_size
        if offset + byte_size > size:
            raise InvalidInput(
                f"{what}: shared_memory_offset {offset} + shared_memory_byte_size {byte_size} "
                f"runs past the end of region '{name}' ({size} bytes)")
        return region, region.status.offset + offset


def object_name(key: str) -> str:
    """The file name a key stands for under the shm root ("/name" or "name"), or InvalidInput:
    one path component only, never '.', '..', empty, NUL or over NAME_MAX bytes, nor a
    semaphore of some process of the server's user."""
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
    if name.startswith("sem."):  # sem_open's objects: an output written there hangs their users
        raise InvalidInput(f"shared memory key '{shown}' names a POSIX semaphore (sem.*), not "
                           "a shared memory region")
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
                           f"got {shown_value(value)}")


_KINDS = {str: "a string", bool: "a boolean", float: "a float", bytes: "bytes", list: "a list",
          dict: "an object", type(None): "null"}


def shown_value(value: Any) -> str:
    """A value a client sent where an integer belongs, as sent: '64' (a string) and 64.0 (a
    float) must not read as the integer 64."""
    if type(value) is int:
        return str(value)
    return f"{repr(value)[:40]} ({_KINDS.get(type(value), type(value).__name__)})"


def _check_object(fd: int, key: str, offset: int, byte_size: int) -> None:
    """InvalidInput unless the object is a file that holds the window."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise InvalidInput(f"shared memory key '{key[:80]}' is not a shared memory object "
                           "(not a regular file)")
    if offset + byte_size > info.st_size:
        raise InvalidInput(
            f"shared memory key '{key[:80]}': offset {offset} + byte_size {byte_size} runs "
            f"past the end of the object ({info.st_size} bytes)")


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

