"""The hardware catalog: name, $/hour, vCPU, memory, accelerator, and the price's source and date.

Prices are data (a YAML file), never code; the default catalog ships beside this module.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

DEFAULT_CATALOG = Path(__file__).with_name("hardware.yaml")


class Hardware(BaseModel):
    """One machine type one can rent (or own, priced per hour)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    usd_per_hour: float = Field(gt=0)
    vcpu: int = Field(ge=1)
    memory_gib: float = Field(gt=0)
    accelerator: str | None = None
    price_source: str = Field(min_length=1)
    price_date: str = Field(min_length=1)


class Catalog(BaseModel):
    """Every hardware option, and how many hours a month has for monthly costs."""

    model_config = ConfigDict(extra="forbid")

    hours_per_month: float = Field(730.0, gt=0)
    hardware: list[Hardware] = Field(min_length=1)

    def get(self, name: str) -> Hardware | None:
        return next((h for h in self.hardware if h.name == name), None)


def load_catalog(path: Path | None = None) -> Catalog:
    """Read and validate a catalog; ValueError naming the file and the first problem."""
    path = path or DEFAULT_CATALOG
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: cannot read the catalog: {exc}") from None
    try:
        catalog = Catalog.model_validate(doc)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise ValueError(f"{path}: field '{where}': {error['msg']}") from None
    names = [h.name for h in catalog.hardware]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: hardware names must be unique")
    return catalog
