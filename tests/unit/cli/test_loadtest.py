"""`serval loadtest`'s verdict on a run: no success at all is a failure naming the errors."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from serval.cli.loadtest import _fail_without_answers

pytestmark = pytest.mark.unit


def _step(answered: int, errors: dict[str, int]) -> dict[str, Any]:
    return {"answered": answered, "errors": errors}


def test_a_run_without_any_success_fails_naming_the_errors(
        capsys: pytest.CaptureFixture[str]) -> None:
    results = {"steps": [_step(0, {"http_503": 4}), _step(0, {"http_503": 2, "timeout": 1})],
               "first_request": {"ok": False, "status": "HTTP 503",
                                 "reason": "model 'm' is not ready"}}
    with pytest.raises(typer.Exit) as raised:
        _fail_without_answers(results)
    assert raised.value.exit_code != 0
    assert capsys.readouterr().err.strip() == (
        "serval: no request succeeded (errors: http_503 x6, timeout x1); the first answer was "
        "HTTP 503: model 'm' is not ready")


def test_one_success_is_enough() -> None:
    _fail_without_answers({"steps": [_step(0, {"http_503": 4}), _step(3, {})]})
