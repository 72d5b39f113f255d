"""The shared-memory registry against real objects in a temporary folder standing in for
/dev/shm: every bound on register, read and write, and release on unregister and close."""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from serval.errors import InvalidInput, Overloaded
from serval.protocol.shared_memory import MAX_KEY_BYTES, SharedMemoryRegistry, object_name

pytestmark = pytest.mark.unit


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "region").write_bytes(bytes(range(256)) * 64)  # 16 KiB
    return tmp_path


@pytest.fixture
def regions(root: Path) -> SharedMemoryRegistry:
    return SharedMemoryRegistry(root, max_regions=3)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("key", ["", "/", "..", "/..", ".", "/a/b", "a/../b", "../region",
                                 "/region\0", "//region", "x" * (MAX_KEY_BYTES + 1)])
def test_keys_that_could_leave_the_shm_folder_are_refused(regions: SharedMemoryRegistry,
                                                          key: str) -> None:
    with pytest.raises(InvalidInput, match="shared memory key"):
        regions.register("r", key, 0, 16)
    assert len(regions) == 0


def test_a_key_is_one_name_with_an_optional_leading_slash() -> None:
    assert object_name("/output_simple") == "output_simple"
    assert object_name("output_simple") == "output_simple"
    assert object_name("x" * MAX_KEY_BYTES) == "x" * MAX_KEY_BYTES


def test_register_opens_the_window_and_status_lists_it(regions: SharedMemoryRegistry) -> None:
    regions.register("r", "/region", 4096 + 10, 100)
    view = regions.read("r", 0, 4, "input 'x'")
    assert bytes(view) == bytes(range(10, 14))  # offsets past a page boundary work
    assert [s.as_dict() for s in regions.status()] == [
        {"name": "r", "key": "/region", "offset": 4106, "byte_size": 100}]
    assert regions.status("r")[0].byte_size == 100


@pytest.mark.parametrize(("offset", "byte_size"), [(0, 16 * 1024 + 1), (16 * 1024, 1),
                                                   (16 * 1024 - 8, 16)])
def test_a_window_past_the_objects_end_is_refused(regions: SharedMemoryRegistry, offset: int,
                                                  byte_size: int) -> None:
    with pytest.raises(InvalidInput, match=r"past the end of the object \(16384 bytes\)"):
        regions.register("r", "/region", offset, byte_size)


@pytest.mark.parametrize(("offset", "byte_size", "field"), [(-1, 4, "offset"),
                                                            (0, 0, "byte_size"),
                                                            (0, True, "byte_size"),
                                                            ("0", 4, "offset")])
def test_offsets_and_sizes_must_be_integers_in_range(regions: SharedMemoryRegistry, offset: object,
                                                     byte_size: object, field: str) -> None:
    with pytest.raises(InvalidInput, match=f"'{field}' must be an integer"):
        regions.register("r", "/region", offset, byte_size)  # type: ignore[arg-type]


def test_missing_objects_symlinks_and_non_files_are_refused(root: Path,
                                                            regions: SharedMemoryRegistry) -> None:
    with pytest.raises(InvalidInput, match="names no object"):
        regions.register("r", "/absent", 0, 4)
    (root / "link").symlink_to(root / "region")
    with pytest.raises(InvalidInput, match="symbolic link"):
        regions.register("r", "/link", 0, 4)
    (root / "folder").mkdir()
    with pytest.raises(InvalidInput, match=r"not a regular file|cannot be opened"):
        regions.register("r", "/folder", 0, 4)
    os.mkfifo(root / "fifo")
    with pytest.raises(InvalidInput, match="not a regular file"):
        regions.register("r", "/fifo", 0, 4)
    assert len(regions) == 0


def test_messages_never_name_the_servers_folder(root: Path,
                                                regions: SharedMemoryRegistry) -> None:
    with pytest.raises(InvalidInput) as caught:
        regions.register("r", "/absent", 0, 4)
    assert str(root) not in caught.value.message


def test_duplicate_names_and_too_many_regions_are_refused(regions: SharedMemoryRegistry) -> None:
    regions.register("a", "/region", 0, 16)
    with pytest.raises(InvalidInput, match="'a' is already registered"):
        regions.register("a", "/region", 16, 16)
    regions.register("b", "/region", 0, 16)  # one object, several regions: allowed
    regions.register("c", "/region", 0, 16)
    with pytest.raises(InvalidInput, match="at most 3 shared memory regions"):
        regions.register("d", "/region", 0, 16)
    regions.unregister("a")
    regions.register("d", "/region", 0, 16)


@pytest.mark.parametrize("name", ["", "x" * 256, "a\0b"])
def test_region_names_are_bounded(regions: SharedMemoryRegistry, name: str) -> None:
    with pytest.raises(InvalidInput, match="name"):
        regions.register(name, "/region", 0, 16)


def test_views_and_writes_stay_inside_the_region(regions: SharedMemoryRegistry) -> None:
    regions.register("r", "/region", 64, 32)
    with pytest.raises(InvalidInput, match=r"offset 16 \+ shared_memory_byte_size 17 runs "
                                           r"past the end of region 'r' \(32 bytes\)"):
        regions.read("r", 16, 17, "input 'x'")
    with pytest.raises(InvalidInput, match="needs 40 bytes; shared_memory_byte_size is 32"):
        regions.write("r", 0, 32, memoryview(bytes(40)), "output 'y'")
    with pytest.raises(InvalidInput, match="runs past the end"):
        regions.write("r", 30, 4, memoryview(bytes(4)), "output 'y'")
    regions.write("r", 8, 8, memoryview(b"abcdefgh"), "output 'y'")
    assert bytes(regions.read("r", 8, 8, "input 'x'")) == b"abcdefgh"
    with pytest.raises(InvalidInput, match="Unable to find system shared memory region: 'q'"):
        regions.read("q", 0, 1, "input 'x'")


def test_writes_reach_the_object_and_reads_are_copies(root: Path,
                                                      regions: SharedMemoryRegistry) -> None:
    regions.register("r", "/region", 0, 16)
    regions.write("r", 0, 4, memoryview(b"\xff\xfe\xfd\xfc"), "output 'y'")
    assert (root / "region").read_bytes()[:4] == b"\xff\xfe\xfd\xfc"
    array = np.frombuffer(regions.read("r", 0, 16, "input 'x'"), dtype=np.uint8)
    regions.write("r", 0, 4, memoryview(bytes(4)), "output 'y'")
    assert array[:4].tolist() == [0xFF, 0xFE, 0xFD, 0xFC]  # the request's own bytes


def test_unregister_releases_the_descriptor(regions: SharedMemoryRegistry) -> None:
    before = _open_fds()
    regions.register("r", "/region", 0, 16)
    regions.register("s", "/region", 0, 16)
    regions.unregister("r")
    regions.unregister("not-there")  # nothing to do, as Triton
    regions.unregister()
    assert len(regions) == 0
    assert _open_fds() == before


def test_a_read_in_use_outlives_unregister(regions: SharedMemoryRegistry) -> None:
    before = _open_fds()
    regions.register("r", "/region", 0, 16)
    array = np.frombuffer(regions.read("r", 0, 16, "input 'x'"), dtype=np.uint8)
    regions.close()  # as at shutdown, while a request still reads
    assert len(regions) == 0
    assert _open_fds() == before
    assert array[:3].tolist() == [0, 1, 2]


def test_an_object_shrunk_after_registering_is_refused_not_read(
        root: Path, regions: SharedMemoryRegistry) -> None:
    regions.register("r", "/region", 4096, 64)
    os.truncate(root / "region", 4100)
    with pytest.raises(InvalidInput, match=r"'r': its object \('/region'\) now has 4100 "
                                           r"bytes, fewer than offset 4096 \+ byte_size 64"):
        regions.read("r", 0, 4, "input 'x'")
    with pytest.raises(InvalidInput, match="now has 4100 bytes"):
        regions.write("r", 0, 4, memoryview(bytes(4)), "output 'y'")
    regions.unregister("r")


def test_an_object_shrunk_while_requests_run_never_faults(root: Path) -> None:
    """A client truncating its object at any moment (here: between every read and write, in a
    thread, for a while) gets a clear error or its bytes, and the server lives: a mapping read
    past the object's end would kill this process with SIGBUS."""
    regions = SharedMemoryRegistry(root)
    regions.register("r", "/region", 0, 16 * 1024)
    stop = threading.Event()

    def shrink_and_grow() -> None:
        while not stop.is_set():
            os.truncate(root / "region", 0)
            os.truncate(root / "region", 16 * 1024)

    thread = threading.Thread(target=shrink_and_grow)
    thread.start()
    outcomes = set()
    try:
        for _ in range(2_000):
            try:
                data = regions.read("r", 0, 16 * 1024, "input 'x'")
                assert data.nbytes == 16 * 1024
                regions.write("r", 0, 8, memoryview(bytes(8)), "output 'y'")
                outcomes.add("read")
            except InvalidInput as exc:
                assert "region 'r'" in str(exc) or "'r': its object" in str(exc)
                outcomes.add("refused")
    finally:
        stop.set()
        thread.join()
        regions.close()
    assert "refused" in outcomes


class _Budget:
    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes, self.held = limit_bytes, 0

    def reserve(self, size_bytes: int) -> bool:
        if self.held + size_bytes > self.limit_bytes:
            return False
        self.held += size_bytes
        return True

    def release(self, size_bytes: int) -> None:
        self.held -= size_bytes

    def refusal_message(self, size_bytes: int) -> str:
        return f"holds {self.held} of {self.limit_bytes}"


def test_copies_count_against_the_budget_until_freed(root: Path) -> None:
    budget = _Budget(1_000)
    regions = SharedMemoryRegistry(root, budget=budget)
    regions.register("r", "/region", 0, 2_000)
    first = np.frombuffer(regions.read("r", 0, 600, "input 'x'"), np.uint8)[10:]  # a view
    assert budget.held == 600
    with pytest.raises(Overloaded, match="holds 600 of 1000"):
        regions.read("r", 0, 600, "input 'x'")
    with pytest.raises(InvalidInput, match=r"input 'x': its 1001 bytes in shared memory are "
                                           r"more than this server holds of requests at once "
                                           r"\(1000, --receive-budget-mb\)"):
        regions.read("r", 0, 1_001, "input 'x'")
    del first
    gc.collect()
    assert budget.held == 0
    regions.read("r", 0, 1_000, "input 'x'")
    regions.close()
