"""The status page in headless Chromium against a real server under light load."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests import fixture_models
from tests.conftest import RunningServer
from tests.e2e.conftest import ARTIFACTS
from tests.integration.http_helpers import infer

pytestmark = [pytest.mark.e2e, pytest.mark.integration]
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}
ROWS = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 8], "data": [0.1] * 24}]}
TENANTS = 60
NONZERO = re.compile(r"^(?!0\.0$)\d")  # a rate the page shows as more than 0.0


def _publish(source: Path, repository: Path, model: str, note: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "serval", "repo", "publish", str(source), "-r", str(repository),
         "-m", model, "--note", note], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("status-repo")
    build = tmp_path_factory.mktemp("status-build")
    fixture_models.linear(root)
    fixture_models.add_sub(root)
    _publish(fixture_models.linear(build / "a", seed=1), root, "recommender", "nightly 1")
    for index in range(TENANTS):
        version = root / f"tenant-{index:03d}" / "1"
        version.mkdir(parents=True)
        os.link(root / "linear" / "1" / "model.onnx", version / "model.onnx")
    return root


@pytest.fixture(scope="module")
def live_server(server_factory: Callable[..., RunningServer],
                repository: Path) -> Iterator[RunningServer]:
    """The server, with a few clients sending light traffic for as long as the module runs."""
    server = server_factory(repository, "--poll-interval-s", "0.3", "--memory-budget", "256MiB",
                            "--model-control", "lazy")
    stop = threading.Event()

    def traffic(models: list[str], body: dict[str, Any]) -> None:
        while not stop.is_set():
            for model in models:
                infer(server.url, model, body)
            stop.wait(0.02)

    clients = [threading.Thread(target=traffic, args=(["linear", "recommender"], X), daemon=True),
               threading.Thread(target=traffic, args=(["linear", "tenant-007"], ROWS),
                                daemon=True)]
    for client in clients:
        client.start()
    yield server
    stop.set()
    for client in clients:
        client.join(timeout=10)


@pytest.fixture
def page(browser_context: Any, live_server: RunningServer) -> Iterator[Any]:
    page = browser_context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{live_server.base}/")
    page.wait_for_selector("#models tbody tr")
    yield page
    page.close()
    assert errors == [], errors


def _row(page: Any, model: str) -> Any:
    return page.locator(f'#models tbody tr[data-model="{model}"]')


def test_the_table_lists_the_models_one_page_at_a_time(page: Any) -> None:
    total = TENANTS + 3
    expect(page.locator("#page-info")).to_contain_text(f"{total} models")
    names = page.locator("#models tbody tr td.name").all_text_contents()
    assert names[:3] == ["add_sub", "linear", "recommender"] and len(names) == 50
    expect(page.locator("#auth")).to_be_hidden()  # no tokens configured: no token form
    expect(page.locator("#live")).to_have_text("● live")
    assert page.locator("#page-info").text_content().startswith(f"page 1 of 2 · {total}")
    page.click("#next")
    expect(page.locator("#page-info")).to_contain_text("page 2 of 2")
    assert page.locator("#models tbody tr").count() == total - 50
    assert _row(page, "tenant-059").count() == 1


def test_search_filters_on_the_server(page: Any) -> None:
    page.fill("#search", "tenant-00")
    expect(page.locator("#models tbody tr")).to_have_count(10)
    names = page.locator("#models tbody tr td.name").all_text_contents()
    assert names == [f"tenant-{i:03d}" for i in range(10)]
    page.fill("#search", "recomm")
    expect(page.locator("#models tbody tr")).to_have_count(1)
    assert _row(page, "recommender").locator("td.version").text_content() in ("v1", "v2")


def test_a_published_version_appears_without_reload(page: Any, repository: Path,
                                                    tmp_path: Path) -> None:
    busy = _row(page, "linear").locator("td.rps")
    expect(busy).to_have_text(NONZERO)
    version = _row(page, "recommender").locator("td.version")
    expect(version).to_have_text("v1")
    page.evaluate("window.__notReloaded = true")
    _publish(fixture_models.linear(tmp_path, seed=2), repository, "recommender", "nightly 2")
    expect(version).to_have_text("v2", timeout=30_000)
    assert page.evaluate("window.__notReloaded") is True


def test_the_detail_view_draws_latency_and_batch_sizes(page: Any) -> None:
    _row(page, "linear").click()
    page.wait_for_selector("#detail:not([hidden])")
    assert page.locator("#d-name").text_content() == "linear"
    p99 = page.locator('#latency-chart polyline[data-series="v1 p99"]')
    expect(p99).to_have_attribute("data-points", re.compile(r"^([6-9]|\d\d+)$"), timeout=20_000)
    box = p99.bounding_box()
    assert box is not None and box["width"] > 15  # drawn across time, not a dot
    bars = page.locator("#batch-chart rect.bar-rect")
    labels = {bars.nth(i).get_attribute("data-label") for i in range(bars.count())}
    assert {"1", "3"} <= labels  # one-row and three-row requests
    tallest = max(range(bars.count()), key=lambda i: int(bars.nth(i).get_attribute("data-value")))
    box = bars.nth(tallest).bounding_box()
    assert box is not None and box["height"] > 50  # the busiest batch size fills the chart
    assert page.locator("#d-versions tbody tr").count() == 1
    assert "#model=linear" in page.url
    page.fill("#search", "")
    page.select_option("#sort", "requests_per_s")
    expect(page.locator("#models tbody tr td.name").first).to_have_text("linear")
    page.wait_for_timeout(1500)  # a couple more points on the charts
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "status-page.png"))
    assert (ARTIFACTS / "status-page.png").stat().st_size > 10_000


def test_with_tokens_the_page_asks_for_one_with_the_read_scope(
    browser_context: Any, server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    fixture_models.linear(tmp_path / "repo")
    tokens = tmp_path / "tokens.yaml"
    secrets = {}
    for scope in ("read", "infer:*"):
        created = subprocess.run(
            [sys.executable, "-m", "serval", "token", "create", "--tokens-file", str(tokens),
             "--scope", scope, "--name", scope.rstrip(":*")],
            capture_output=True, text=True, timeout=60, check=True)
        secrets[scope] = created.stdout.strip()
    server = server_factory(tmp_path / "repo", "--auth-tokens", str(tokens))
    page = browser_context.new_page()
    try:
        page.goto(f"{server.base}/ui")
        expect(page.locator("#auth")).to_be_visible()
        expect(page.locator("#models tbody tr")).to_have_count(0)
        page.fill("#token", secrets["infer:*"])
        page.click("#auth button")
        expect(page.locator("#auth-error")).to_contain_text("may not read")
        page.fill("#token", secrets["read"])
        page.click("#auth button")
        expect(_row(page, "linear").locator("td.version")).to_have_text("v1")
        expect(page.locator("#auth")).to_be_hidden()
    finally:
        page.close()


def test_at_1280_px_nothing_overflows_and_the_cards_say_what_they_count(page: Any) -> None:
    """A laptop screen with the detail view open: no table runs past its panel, the page has
    no sideways scroll; the Models card counts models, its line versions by state; a model
    never asked for says its charts have had no traffic."""
    page.set_viewport_size({"width": 1280, "height": 900})
    _row(page, "recommender").click()
    page.wait_for_selector("#detail:not([hidden]) #d-versions tbody tr")
    overflow = page.evaluate("""() => {
        const wide = (el) => el.scrollWidth > el.clientWidth + 1;
        return {page: document.documentElement.scrollWidth > window.innerWidth,
                panels: [...document.querySelectorAll('.models, #detail, .table-scroll, .card')]
                    .filter(wide).map((el) => `${el.id || el.className} ${el.scrollWidth}>` +
                                              `${el.clientWidth}: ${el.innerText.slice(0, 80)}`)};
    }""")
    assert overflow == {"page": False, "panels": []}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "status-page-1280.png"))
    models = int(page.locator("#s-models").text_content().replace(",", ""))
    assert models == TENANTS + 3  # linear, add_sub, recommender and the tenants
    assert re.fullmatch(r"\d+ versions?: .*\d+ ready.*", page.locator("#s-states").text_content())
    _row(page, "add_sub").click()
    expect(page.locator("#d-name")).to_have_text("add_sub")
    expect(page.locator("#rps-chart")).to_contain_text("no traffic yet")
