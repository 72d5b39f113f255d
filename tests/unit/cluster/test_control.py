"""Membership requests between `serval cluster add-node` and the `up` process that owns the
nodes: a request file, a SIGHUP, a reply file."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from serval.cluster import control

pytestmark = pytest.mark.unit


def test_a_request_reaches_the_owner_and_its_reply_comes_back(tmp_path: Path) -> None:
    woken = threading.Event()
    previous = signal.signal(signal.SIGHUP, lambda *_: woken.set())
    replies: list[dict[str, Any]] = []
    try:
        asker = threading.Thread(target=lambda: replies.append(control.submit(
            tmp_path, os.getpid(), {"op": "add", "address": None}, timeout_s=30)))
        asker.start()
        assert woken.wait(30)
        (path, request), = control.pending(tmp_path)
        assert request == {"op": "add", "address": None}
        assert control.pending(tmp_path) == []  # read once
        control.answer(path, {"ok": True, "name": "node4"})
        asker.join(30)
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert replies == [{"ok": True, "name": "node4"}]


def test_an_owner_that_never_answers_is_a_clear_error(tmp_path: Path) -> None:
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        reply = control.submit(tmp_path, os.getpid(), {"op": "remove"}, timeout_s=0.2)
    finally:
        signal.signal(signal.SIGHUP, previous)
    assert reply == {"ok": False, "error": "the cluster did not answer within 0 s"}
