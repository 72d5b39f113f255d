"""Membership requests to a running `serval cluster up`: another process (`serval cluster
add-node` / `remove-node`) drops a request file in the cluster's run folder and sends SIGHUP;
the `up` process, the one owner of the nodes and the proxy, applies it and writes the reply."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

REQUESTS = "requests"


def submit(run_dir: Path, owner_pid: int, request: dict[str, Any],
           timeout_s: float) -> dict[str, Any]:
    """Hand REQUEST to the owner and wait for its reply ({'ok': bool, ...})."""
    folder = run_dir / REQUESTS
    folder.mkdir(exist_ok=True)
    name = uuid.uuid4().hex
    temporary = folder / f"{name}.tmp"
    temporary.write_text(json.dumps(request))
    os.replace(temporary, folder / f"{name}.request")
    os.kill(owner_pid, signal.SIGHUP)
    reply = folder / f"{name}.reply"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            answer = json.loads(reply.read_text())
            reply.unlink(missing_ok=True)
            return dict(answer)
        time.sleep(0.05)
    return {"ok": False, "error": f"the cluster did not answer within {timeout_s:.0f} s"}


def pending(run_dir: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Requests waiting, oldest first (each is removed as it is read)."""
    folder = run_dir / REQUESTS
    found = []
    for path in sorted(folder.glob("*.request"), key=lambda p: p.stat().st_mtime):
        with contextlib.suppress(OSError, ValueError):
            found.append((path, dict(json.loads(path.read_text()))))
            path.unlink()
    return found


def answer(request_path: Path, reply: dict[str, Any]) -> None:
    temporary = request_path.with_suffix(".tmp")
    temporary.write_text(json.dumps(reply))
    os.replace(temporary, request_path.with_suffix(".reply"))
