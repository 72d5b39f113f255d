"""The hardware catalog: the seed prices ship as data, a bad catalog names the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from serval.planner.catalog import load_catalog

pytestmark = pytest.mark.unit


def test_default_catalog_carries_the_seed_prices() -> None:
    catalog = load_catalog()
    prices = {h.name: h.usd_per_hour for h in catalog.hardware}
    assert prices["g4dn.xlarge"] == 0.647 and prices["t3a.xlarge"] == 0.1872
    assert prices["g4dn.12xlarge"] == 4.694 and prices["inf1.2xlarge"] == 0.435
    assert any(h.accelerator is None for h in catalog.hardware)
    assert all(h.price_source and h.price_date for h in catalog.hardware)


def test_a_bad_catalog_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "hw.yaml"
    path.write_text("hardware:\n  - {name: x, usd_per_hour: -1, vcpu: 2, memory_gib: 4, "
                    "price_source: me, price_date: today}\n")
    with pytest.raises(ValueError, match=r"hardware\.0\.usd_per_hour"):
        load_catalog(path)
