"""The status page's assets: only the files shipped under static/ are served, looked up by name
in a table read once, so a client's names (any length, any number of them) are never kept and
never reach the file system."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from serval.server.http.ui.routes import StatusRoutes
from serval.server.http.ui.status import ServerStatus
from tests.unit.server.http.ui.test_status import _Registry

pytestmark = pytest.mark.unit


def _routes() -> StatusRoutes:
    return StatusRoutes(ServerStatus(_Registry([])))  # type: ignore[arg-type]


def test_the_shipped_files_are_served() -> None:
    routes = _routes()
    status, body, headers = routes.asset("GET", ["ui", "app.js"])
    assert status == 200 and body
    assert (b"content-type", b"text/javascript; charset=utf-8") in headers
    assert routes.asset("GET", [""])[0] == 200  # index.html


@pytest.mark.parametrize("name", [
    "b" * 300 + ".js",  # a file name longer than the file system's 255 bytes: was a 500
    "x" * 8000 + ".css", "missing.js", "../routes.py", "..", ".hidden.js", "status.py",
    "static/app.js", "a\0b.js", "app.js/", "APP.JS",
])
def test_any_other_name_is_a_plain_404(name: str) -> None:
    status, body, _ = _routes().asset("GET", ["ui", *name.split("/")])
    assert status == 404
    assert b"the page's files are app.js, charts.js, index.html, style.css" in body
    assert len(body) < 400  # the name is quoted cut short


def test_names_asked_for_are_not_kept() -> None:
    routes = _routes()
    routes.asset("GET", ["ui", "warm.js"])
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for index in range(2000):  # distinct names, each 404: once cached for ever (~1 MB)
            routes.asset("GET", ["ui", f"{index:06d}{'a' * 230}.js"])
        gc.collect()
        grown = sum(stat.size_diff for stat in
                    tracemalloc.take_snapshot().compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert grown < 100_000
