"""A server's process tree from /proc: its pids (workers and engine processes) and their RSS."""

from __future__ import annotations

import contextlib
import os
import resource
from pathlib import Path

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def children(pid: int) -> list[int]:
    """Direct children of every thread of `pid` (processes spawned from threads included)."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                found += [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                continue
    except OSError:
        return []
    return found


def tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    pids, queue = [], [pid]
    while queue:
        current = queue.pop()
        pids.append(current)
        queue += children(current)
    return pids


def rss_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_bytes(pid: int) -> int:
    """Resident memory summed over the server's processes."""
    return sum(rss_bytes(p) for p in tree(pid))


def is_serving_worker(pid: int) -> bool:
    """A `--workers` process or engine process (multiprocessing spawn), not its resource tracker."""
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def raise_open_files_limit() -> int:
    """Lift this process's (and its children's) open-file soft limit to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def server_pid(port: int) -> int:
    """The `serval serve` parent process listening on --http-port `port`."""
    needle = f"--http-port\0{port}\0".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"serve\0" in cmdline and needle in cmdline and b"spawn_main" not in cmdline:
            return int(entry.name)
    raise LookupError(f"no serval serve process for port {port}")


SIMD_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8")


def cpu_features() -> dict[str, object]:
    """The CPU's model name and the SIMD flags INT8 and BF16 speed turns on (/proc/cpuinfo):
    a benchmark's INT8 ratio means little without them."""
    model, flags = "", set()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not model:
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    return {"model": model, "simd": [flag for flag in SIMD_FLAGS if flag in flags]}
