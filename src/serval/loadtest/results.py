"""A results file of `serval loadtest -o`: its schema, and the one reader that report, plan and
tune's callers use (every field those read is checked here, so they never meet a bad value)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

RESULTS_FORMAT = "serval-loadtest/1"

Count = Annotated[int, Field(ge=0)]
Milliseconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Percentile = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]


class Step(BaseModel):
    """One load level's figures (runner.step_json writes them)."""

    model_config = ConfigDict(extra="allow")

    mode: Literal["closed", "open"]
    concurrency: Annotated[int, Field(ge=1)] | None = None
    offered_rps: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    requests: Count
    answered: Count
    throughput_rps: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    p50_ms: Milliseconds
    p90_ms: Milliseconds
    p99_ms: Milliseconds
    p999_ms: Milliseconds
    mean_ms: Milliseconds
    errors: dict[str, Count]
    cdf_ms: list[tuple[Percentile, Milliseconds]] = []
    generator_bound: bool = False

    @model_validator(mode="after")
    def _level(self) -> Step:
        if self.mode == "closed" and self.concurrency is None:
            raise ValueError("a closed-loop step needs its concurrency")
        if self.mode == "open" and self.offered_rps is None:
            raise ValueError("an open-loop step needs its offered_rps")
        return self


class Results(BaseModel):
    """The whole run: what was measured, where, and one Step per load level."""

    model_config = ConfigDict(extra="allow")

    format: Literal["serval-loadtest/1"]
    label: str
    model: str
    url: str
    protocol: str
    duration_s: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    warmup_s: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    created: str
    hardware: str | None = None
    generator_ceiling_rps: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    steps: list[Step]


def load_results(path: Path) -> dict[str, Any]:
    """A results file written by `serval loadtest -o`; ValueError naming the file and the first
    field that is wrong."""
    import orjson

    try:
        data = path.read_bytes()
        doc = orjson.loads(data)
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON file: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != RESULTS_FORMAT:
        raise ValueError(f"{path}: not a results file of `serval loadtest -o` "
                         f"(expected format {RESULTS_FORMAT!r})")
    try:
        Results.model_validate_json(data, strict=True)  # strict: no "5" taken for 5
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "(file)"
        raise ValueError(f"{path}: field '{where}': {error['msg']}") from None
    return doc  # as written (checked above)
