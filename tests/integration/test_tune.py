"""serval tune on a real model: a tiny search space, a short budget, a config that serves."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from serval.model_config import load_model_config
from tests import fixture_models

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_tune_searches_and_writes_the_best_config(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "serval", "tune", "--repository", str(tmp_path), "--model",
         "linear", "--slo-p99-ms", "200", "--budget", "60s", "--threads", "1",
         "--max-batch", "8", "--queue-delay-ms", "0", "--instances", "1", "--workers", "1",
         "--concurrency", "1,4", "--trial-duration", "0.4", "--trial-warmup", "0.1"],
        capture_output=True, text=True, timeout=150, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr + run.stdout
    trials = [line for line in run.stdout.splitlines() if line.startswith("trial")]
    # default, threads=1, max_batch_size=8, then their combination (if it differs)
    assert 3 <= len(trials) <= 5, run.stdout
    assert "[default" in trials[0] and all("req/s at SLO" in t for t in trials), run.stdout
    assert re.search(r"\d\.\d\dx|within 5%|misses the SLO", run.stdout), run.stdout
    written = yaml.safe_load((tmp_path / "linear" / "config.yaml").read_text())
    assert written["max_batch_size"] in (8, 32)
    assert load_model_config(tmp_path / "linear" / "config.yaml").max_batch_size in (8, 32)
    assert (tmp_path / "linear" / "config.yaml.bak").read_text() == "max_batch_size: 32\n"


def test_tune_dry_run_writes_nothing(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    shutil.copy(tmp_path / "linear" / "config.yaml", tmp_path / "before.yaml")
    run = subprocess.run(
        [sys.executable, "-m", "serval", "tune", "--repository", str(tmp_path), "--model",
         "linear", "--slo-p99-ms", "200", "--budget", "1s", "--threads", "1",
         "--max-batch", "8", "--queue-delay-ms", "0", "--instances", "1", "--workers", "1",
         "--concurrency", "2", "--trial-duration", "0.3", "--trial-warmup", "0", "--dry-run"],
        capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr + run.stdout
    assert "dry run" in run.stdout
    assert (tmp_path / "linear" / "config.yaml").read_text() == \
        (tmp_path / "before.yaml").read_text()


def test_a_budget_that_ends_the_sweep_is_said_and_writes_nothing(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    before = (tmp_path / "linear" / "config.yaml").read_text()
    run = subprocess.run(
        [sys.executable, "-m", "serval", "tune", "--repository", str(tmp_path), "--model",
         "linear", "--slo-p99-ms", "200", "--budget", "1s", "--threads", "1,2",
         "--max-batch", "4,8,16", "--queue-delay-ms", "0,1,2", "--instances", "1,2",
         "--workers", "1", "--concurrency", "2", "--trial-duration", "0.4",
         "--trial-warmup", "0"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 0, run.stderr + run.stdout
    assert re.search(r"warning: the 1 s budget ran out after \d+ trials, before .*instances.* "
                     r"were tried; not written", run.stdout), run.stdout
    assert "not written" in run.stdout and "written to" not in run.stdout
    assert (tmp_path / "linear" / "config.yaml").read_text() == before


def test_tune_refuses_a_missing_model(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "serval", "tune", "--repository", str(tmp_path),
                          "--model", "nope", "--slo-p99-ms", "10"], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "does not exist" in run.stderr


def test_a_model_that_cannot_load_stops_at_its_load_error_with_no_best_config(
    tmp_path: Path,
) -> None:
    version = tmp_path / "broken" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(b"\x00not an onnx model" * 100)
    (tmp_path / "broken" / "²").mkdir()  # not a version folder (int('²') crashed the listing)
    run = subprocess.run(
        [sys.executable, "-m", "serval", "tune", "--repository", str(tmp_path), "--model",
         "broken", "--slo-p99-ms", "200", "--budget", "10m", "--threads", "1,2",
         "--max-batch", "8,16", "--queue-delay-ms", "0", "--instances", "1", "--workers", "1",
         "--concurrency", "1", "--trial-duration", "0.3", "--trial-warmup", "0", "--dry-run"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert run.returncode == 1, run.stderr + run.stdout
    assert run.stderr.startswith("serval: the model failed as configured, so nothing else "
                                 "was tried: "), run.stderr
    assert run.stdout.count("trial ") == 1, run.stdout  # no other knob was tried
    assert "HTTP 503" in run.stderr and "load failed" in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "best config.yaml" not in run.stdout, run.stdout
