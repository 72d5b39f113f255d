"""The results-file schema: a file written by `serval loadtest -o` reads back as written; a bad
field is one ValueError naming the file and the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from serval.loadtest.results import RESULTS_FORMAT, load_results

pytestmark = pytest.mark.unit


def results_doc() -> dict[str, Any]:
    step = {"mode": "closed", "concurrency": 1, "offered_rps": None, "requests": 10,
            "answered": 10, "throughput_rps": 100.0, "p50_ms": 1.0, "p90_ms": 1.0,
            "p99_ms": 1.0, "p999_ms": 1.0, "mean_ms": 1.0, "errors": {},
            "cdf_ms": [[0.0, 1.0], [100.0, 1.0]], "generator_bound": False}
    return {"format": RESULTS_FORMAT, "url": "http://127.0.0.1:1", "model": "m",
            "protocol": "http", "duration_s": 1.0, "warmup_s": 0.0, "hardware": "c6a.large",
            "label": "m (http)", "created": "2026-01-01T00:00:00+00:00",
            "generator_ceiling_rps": None, "first_request": {"ok": True}, "steps": [step]}


def test_a_good_file_reads_back_as_written(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(results_doc()))
    assert load_results(path) == results_doc()


def _step(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: doc["steps"][0].update(fields)


@pytest.mark.parametrize(("mutate", "field", "reason"), [
    (lambda doc: doc.update(steps=None), "steps", "valid array"),
    (lambda doc: doc.update(label=None), "label", "valid string"),
    (lambda doc: doc.pop("model"), "model", "Field required"),
    (_step(p99_ms=None), "steps.0.p99_ms", "valid number"),
    (_step(p99_ms="fast"), "steps.0.p99_ms", "valid number"),
    (_step(p99_ms="5"), "steps.0.p99_ms", "valid number"),
    (_step(p99_ms=-1), "steps.0.p99_ms", "greater than or equal to 0"),
    (_step(requests=2.5), "steps.0.requests", "valid integer"),
    (_step(errors={"http_500": "x"}), "steps.0.errors.http_500", "valid integer"),
    (_step(cdf_ms=[[1]]), "steps.0.cdf_ms.0.1", "Field required"),
    (_step(cdf_ms=[[101, 1.0]]), "steps.0.cdf_ms.0.0", "less than or equal to 100"),
    (_step(mode="ramp"), "steps.0.mode", "'closed' or 'open'"),
    (_step(concurrency=None), "steps.0", "needs its concurrency"),
])
def test_a_bad_field_is_named_with_its_file(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], None], field: str, reason: str
) -> None:
    doc = results_doc()
    mutate(doc)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as caught:
        load_results(path)
    assert len(str(caught.value).splitlines()) == 1
    assert str(caught.value).startswith(f"{path}: field '{field}': ")
    assert reason in str(caught.value)


def test_a_file_of_another_format_says_what_it_expected(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({**results_doc(), "format": "other/1"}))
    with pytest.raises(ValueError, match="expected format 'serval-loadtest/1'"):
        load_results(path)
