"""Headless Chromium (Debian's `chromium`, driven by Playwright) against a real server."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(os.environ.get("SERVAL_E2E_ARTIFACTS", ROOT / "build" / "e2e"))


def chromium_path() -> str | None:
    """The system's Chromium (`make setup` installs Debian's package); never a downloaded one."""
    for candidate in (os.environ.get("SERVAL_CHROMIUM"), shutil.which("chromium"),
                      shutil.which("chromium-browser"), "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    executable = chromium_path()
    if executable is None:
        pytest.skip("no chromium found (apt-get install chromium, or set SERVAL_CHROMIUM)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=executable,
            headless=True, args=CHROMIUM_ARGS, viewport={"width": 1440, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()
