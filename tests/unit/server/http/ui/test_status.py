"""ServerStatus: chart points for the busiest versions, state changes as events, the models page."""

from __future__ import annotations

from pathlib import Path

import pytest

from serval.errors import InvalidInput
from serval.observability.window import POINTS_PER_SECOND
from serval.repository.served import ModelState, ServedModel
from serval.server.http.ui.status import PageQuery, ServerStatus
from serval.stats import ModelStats
from tests.unit.observability.test_window import _serve

pytestmark = pytest.mark.unit


class _Registry:
    """What ServerStatus reads of the registry."""

    control, root, loads, evictions, hits, misses = "lazy", Path("."), 0, 0, 0, 0
    memory_budget_bytes, resident_bytes = None, 0

    def __init__(self, versions: list[ServedModel]) -> None:
        self.versions = versions
        self.totals = ModelStats("_all", "")

    def all_models(self) -> list[ServedModel]:
        return self.versions

    def get(self, name: str) -> ServedModel:  # one version per name here
        return next(served for served in self.versions if served.name == name)


def test_only_the_busiest_versions_get_chart_points_and_state_changes_become_events() -> None:
    versions = [ServedModel(f"m{i:03d}", "1", ModelState.READY)
                for i in range(POINTS_PER_SECOND + 20)]
    clock = [0.0]
    status = ServerStatus(_Registry(versions), clock=lambda: clock[0])  # type: ignore[arg-type]
    status.sample()
    for index, served in enumerate(versions):
        _serve(served.stats, 1 + index, 0.001)
    versions[0].state, versions[0].reason = ModelState.EVICTED, "evicted to fit the budget"
    clock[0] = 1.0
    status.sample()
    charted = {s.name for s in versions if status._window(s).points}
    assert charted == {s.name for s in versions[20:]}  # the 100 busiest of this second
    page = status.models_page(PageQuery(sort="requests_per_s", descending=True, per_page=3))
    assert [row["name"] for row in page["models"]] == ["m119", "m118", "m117"]
    assert page["total"] == 120 and page["pages"] == 40
    events = status.summary()["events"]
    assert [(e["model"], e["state"], e["reason"]) for e in events] == [
        ("m000", "EVICTED", "evicted to fit the budget")]


@pytest.mark.parametrize("value", ["\uff11\uff12", " 12", "1_2", "+3", "-1", "9" * 30, ""])
def test_page_numbers_are_plain_ascii_digits(value: str) -> None:
    with pytest.raises(InvalidInput, match="page must be an integer from 1 to 1000000000"):
        PageQuery.parse({"page": value})
    assert PageQuery.parse({"page": "12"}).page == 12
