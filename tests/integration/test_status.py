"""The status page's JSON endpoints and assets on a real server: figures, paging, search, auth."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call, infer

pytestmark = pytest.mark.integration
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}
BAD = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 7], "data": [0.5] * 7}]}


def _get(server: RunningServer, path: str, headers: dict[str, str] | None = None) -> Any:
    reply = call(server.url, "GET", path, headers=headers)
    assert reply.status == 200, (path, reply.status, reply.body)
    return reply.json()


def _serval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serval", *args], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def busy(server_factory: Callable[..., RunningServer],
         tmp_path_factory: pytest.TempPathFactory) -> RunningServer:
    """linear (hot), add_sub (idle), plus a published model `clf` with a note."""
    root = tmp_path_factory.mktemp("status")
    fixture_models.linear(root)
    fixture_models.add_sub(root)
    built = fixture_models.linear(tmp_path_factory.mktemp("build"), seed=3)
    assert _serval("repo", "publish", str(built), "-r", str(root), "-m", "clf",
                   "--note", "first cut").returncode == 0
    server = server_factory(root, "--memory-budget", "64MiB", "--poll-interval-s", "0.2")
    for _ in range(40):
        assert infer(server.url, "linear", X).status == 200
    for _ in range(3):
        assert infer(server.url, "linear", BAD).status == 400
    _wait_for_recent_figures(server)
    return server


def _wait_for_recent_figures(server: RunningServer) -> None:
    """Until the status window has sampled past the traffic (it samples about once a second),
    so every test sees the same recent figures whichever runs first."""
    deadline = time.monotonic() + 15
    while True:
        linear = {m["name"]: m for m in _get(server, "/status/models")["models"]}["linear"]
        if linear["batch_mean"] is not None:
            return
        assert time.monotonic() < deadline, linear
        time.sleep(0.1)


def test_summary_counts_requests_errors_memory_and_models(busy: RunningServer) -> None:
    summary = _get(busy, "/status")
    assert summary["requests_total"] == 43 and summary["errors_total"] == 3
    assert summary["recent"]["requests_per_s"] > 0
    assert 0 < summary["recent"]["p50_ms"] <= summary["recent"]["p99_ms"]
    assert summary["memory_budget_bytes"] == 64 * 1024 * 1024
    assert 0 < summary["resident_bytes"] <= summary["memory_budget_bytes"]
    assert summary["process_resident_bytes"] > summary["resident_bytes"]
    assert summary["loads"] == 3 and summary["evictions"] == 0
    assert summary["models"] == {"names": 3, "versions": 3, "by_state": {"READY": 3}}
    assert summary["server"]["uptime_s"] > 0 and summary["server"]["model_control"] == "all"
    assert any(point["requests_per_s"] > 0 for point in summary["series"])


def test_model_table_sorts_searches_and_pages(busy: RunningServer) -> None:
    table = _get(busy, "/status/models")
    assert [m["name"] for m in table["models"]] == ["add_sub", "clf", "linear"]
    assert table["total"] == 3 and table["pages"] == 1
    linear = table["models"][2]
    assert linear["serving_version"] == "1" and linear["state"] == "READY"
    assert linear["requests_total"] == 43 and linear["resident_bytes"] > 0
    assert linear["batch_mean"] == 1.0 and linear["p99_ms"] > 0
    busiest = _get(busy, "/status/models?sort=requests_per_s")["models"]
    assert busiest[0]["name"] == "linear" and busiest[0]["requests_per_s"] > 0
    assert [m["name"] for m in _get(busy, "/status/models?q=LIN")["models"]] == ["linear"]
    second = _get(busy, "/status/models?per_page=2&page=2")
    assert [m["name"] for m in second["models"]] == ["linear"] and second["pages"] == 2
    assert _get(busy, "/status/models?state=evicted")["total"] == 0


@pytest.mark.parametrize(("query", "message"), [
    ("page=0", "page must be an integer from 1"),
    ("per_page=abc", "per_page must be an integer from 1 to 500, got 'abc'"),
    ("sort=size", "sort must be one of name, requests_per_s, p99_ms"),
    ("order=up", "order must be asc or desc"),
    ("state=gone", "state must be READY, LOADING, UNAVAILABLE or EVICTED"),
    ("colour=red", "unknown query parameter(s) colour"),
    ("q=a&q=b", "query parameter 'q' given twice"),
])
def test_bad_table_queries_get_a_precise_400(busy: RunningServer, query: str,
                                             message: str) -> None:
    reply = call(busy.url, "GET", f"/status/models?{query}")
    assert reply.status == 400 and message in reply.error


def test_model_detail_has_versions_series_batches_and_history(busy: RunningServer,
                                                              tmp_path: Path) -> None:
    detail = _get(busy, "/status/models/linear")
    assert detail["name"] == "linear" and [v["version"] for v in detail["versions"]] == ["1"]
    assert sum(p["requests"] for p in detail["series"][0]["points"]) == 43
    assert detail["batch_sizes"] == [{"batch_size": 1, "executions": 40}]
    clf = _get(busy, "/status/models/clf")
    assert clf["versions"][0]["note"] == "first cut" and clf["versions"][0]["published_at"]
    built = fixture_models.linear(tmp_path, seed=4)
    assert _serval("repo", "publish", str(built), "-r", str(_repository_of(busy)), "-m", "clf",
                   "--note", "second cut").returncode == 0
    deadline = time.monotonic() + 30
    while (clf := _get(busy, "/status/models/clf"))["serving_version"] != "2":
        assert time.monotonic() < deadline, clf
        time.sleep(0.2)
    assert clf["versions"][-1]["note"] == "second cut"
    deadline = time.monotonic() + 10
    while not any(e["version"] == "2" and e["state"] == "READY" for e in clf["events"]):
        assert time.monotonic() < deadline, clf["events"]
        time.sleep(0.2)
        clf = _get(busy, "/status/models/clf")
    server_events = _get(busy, "/status")["events"]
    assert any(e["model"] == "clf" and e["version"] == "2" for e in server_events)
    assert call(busy.url, "GET", "/status/models/nope").status == 404


def _repository_of(server: RunningServer) -> Path:
    command = server.process.args
    assert isinstance(command, list)
    return Path(command[command.index("--repository") + 1])


def test_the_page_and_its_assets_are_served(busy: RunningServer) -> None:
    for path in ("/", "/ui", "/ui/"):
        reply = call(busy.url, "GET", path)
        assert reply.status == 200 and reply.headers["content-type"].startswith("text/html")
        assert b"/ui/app.js" in reply.body and b"/ui/charts.js" in reply.body
    script = call(busy.url, "GET", "/ui/app.js")
    assert script.status == 200 and script.headers["content-type"].startswith("text/javascript")
    assert b"/status/models" in script.body
    assert call(busy.url, "GET", "/ui/style.css").headers["content-type"].startswith("text/css")
    assert call(busy.url, "GET", "/ui/missing.js").status == 404
    assert call(busy.url, "GET", "/ui/..%2Fapp.py").status == 404
    assert call(busy.url, "POST", "/ui").status == 405
    assert call(busy.url, "POST", "/status").status == 405
    assert call(busy.url, "GET", "/status?x=1").status == 400


def test_an_asset_name_too_long_for_a_file_is_a_plain_404_and_logs_nothing(
        busy: RunningServer) -> None:
    for length in (256, 300, 4000):  # past the file system's 255 bytes: was a 500 + traceback
        reply = call(busy.url, "GET", "/ui/" + "b" * length + ".js")
        assert reply.status == 404, reply.body
        assert reply.error.startswith("no status page asset 'bbbb") and len(reply.body) < 400
    assert call(busy.url, "GET", "/ui/app.js").status == 200  # the server still answers
    log = busy.log()
    assert "bbbbbbbb" not in log and "Traceback" not in log


def test_status_needs_the_read_scope_when_tokens_are_configured(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    fixture_models.linear(tmp_path / "repo")
    tokens = tmp_path / "tokens.yaml"
    secrets = {}
    for scope in ("read", "infer:lin*"):
        result = _serval("token", "create", "--tokens-file", str(tokens), "--scope", scope,
                         "--name", scope.replace("*", ""))
        secrets[scope] = result.stdout.strip()
    server = server_factory(tmp_path / "repo", "--auth-tokens", str(tokens))
    assert call(server.url, "GET", "/").status == 200  # the page itself holds no data
    for path in ("/status", "/status/models", "/status/models/linear"):
        assert call(server.url, "GET", path).status == 401
        denied = call(server.url, "GET", path,
                      headers={"Authorization": f"Bearer {secrets['infer:lin*']}"})
        assert denied.status == 403
        _get(server, path, {"Authorization": f"Bearer {secrets['read']}"})


def test_ten_thousand_models_page_on_the_server(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    source = fixture_models.linear(tmp_path / "build")
    repository = fixture_models.linked_repository(
        tmp_path / "many", source, (f"tenant-{index:05d}" for index in range(10_000)))
    server = server_factory(repository, "--model-control", "lazy", "--memory-budget", "8MiB")
    for name in ("tenant-00042", "tenant-09999"):
        assert infer(server.url, name, X).status == 200
    page = call(server.url, "GET", "/status/models?per_page=50&page=3")
    table = orjson.loads(page.body)
    assert table["total"] == 10_000 and table["pages"] == 200 and len(table["models"]) == 50
    assert table["models"][0]["name"] == "tenant-00100"
    assert len(page.body) < 40_000  # one page, not 10,000 rows
    found = _get(server, "/status/models?q=tenant-0999")
    assert found["total"] == 10 and found["models"][-1]["name"] == "tenant-09999"
    ready = _get(server, "/status/models?state=READY")
    assert [m["name"] for m in ready["models"]] == ["tenant-00042", "tenant-09999"]
    summary = _get(server, "/status")
    assert summary["models"]["names"] == 10_000
    assert summary["models"]["by_state"] == {"READY": 2, "UNAVAILABLE": 9_998}


@pytest.mark.slow
def test_the_built_wheel_ships_the_page_assets(tmp_path: Path) -> None:
    import zipfile

    from tests.conftest import ROOT

    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                            "--wheel-dir", str(tmp_path), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("serval_server-*.whl")  # the distribution serval-server
    names = set(zipfile.ZipFile(wheel).namelist())
    for asset in ("index.html", "app.js", "charts.js", "style.css"):
        assert f"serval/server/http/ui/static/{asset}" in names


def test_the_page_names_the_version_requests_reach_when_the_newest_is_not_ready(
        server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    """Lazy control, v2 broken: once v2 fails to load, unversioned requests reach v1 (loadable,
    not yet loaded), and the page names v1 with its state, not the failed v2."""
    fixture_models.linear(tmp_path, "m", config="max_batch_size: 8\nversion_policy: {all: true}\n")
    (tmp_path / "m" / "2").mkdir()
    (tmp_path / "m" / "2" / "model.onnx").write_bytes(b"\x08\x07this is not an onnx model")
    server = server_factory(tmp_path, "--model-control", "lazy")
    assert infer(server.url, "m", X).status == 503  # reached v2, the newest; its load failed
    detail = _get(server, "/status/models/m")
    assert {v["version"]: v["state"] for v in detail["versions"]} == {
        "1": "UNAVAILABLE", "2": "UNAVAILABLE"}
    row = _get(server, "/status/models")["models"][0]
    for described in (row, detail):
        assert described["serving_version"] == "1", described
        assert (described["state"], described["reason"]) == ("UNAVAILABLE", "not loaded")
    reply = infer(server.url, "m", X)
    assert reply.status == 200 and reply.json()["model_version"] == "1"
    detail = _get(server, "/status/models/m")
    assert (detail["serving_version"], detail["state"]) == ("1", "READY")
