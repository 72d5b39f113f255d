"""Publish, rollback and verify through the CLI against real servers."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import fixture_models
from tests.conftest import RunningServer
from tests.integration.http_helpers import call, infer

pytestmark = pytest.mark.integration

X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 8], "data": [0.5] * 8}]}


def _serval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "serval", *args], capture_output=True,
                          text=True, timeout=120)


def _publish_linears(tmp_path: Path, repository: Path, seeds: list[int]) -> None:
    for seed in seeds:
        built = fixture_models.linear(tmp_path / f"build{seed}", seed=seed)
        result = _serval("repo", "publish", "--create", str(built), "--repository", str(repository),
                         "--model", "clf", "--note", f"seed {seed}")
        assert result.returncode == 0, result.stderr
    (repository / "clf" / "config.yaml").write_text("max_batch_size: 8\n")


def _version(server: RunningServer) -> str:
    return str(infer(server.url, "clf", X).json()["model_version"])


def test_rollback_survives_a_restart(server_factory: Callable[..., RunningServer],
                                     tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    _publish_linears(tmp_path, repository, [1, 2])
    first = server_factory(repository)
    assert _version(first) == "2"
    result = _serval("repo", "rollback", "clf", "--repository", str(repository))
    assert result.returncode == 0 and "now serves version 1" in result.stdout
    assert first.stop() == 0
    assert _version(server_factory(repository)) == "1"
    history = _serval("repo", "history", "clf", "--repository", str(repository)).stdout
    assert "seed 1" in history and "seed 2" in history


def test_a_running_server_picks_up_publish_and_rollback(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    repository = tmp_path / "repo"
    _publish_linears(tmp_path, repository, [1])
    server = server_factory(repository, "--poll-interval-s", "0.1")
    assert _version(server) == "1"
    _publish_linears(tmp_path, repository, [2])
    _wait_for_version(server, "2")
    assert _serval("repo", "rollback", "clf", "--repository", str(repository)).returncode == 0
    _wait_for_version(server, "1")


def test_a_corrupted_version_is_refused_never_served(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    repository = tmp_path / "repo"
    _publish_linears(tmp_path, repository, [1])
    server = server_factory(repository, "--repository-api")
    _publish_linears(tmp_path, repository, [2])
    (repository / "clf" / "2" / "model.onnx").write_bytes(b"tampered")
    reply = call(server.url, "POST", "/v2/repository/models/clf/load")
    assert reply.status == 400 and "does not match its manifest" in reply.error
    assert _version(server) == "1"
    verify = _serval("repo", "verify", "--repository", str(repository))
    assert verify.returncode == 1 and "version 2: corrupted" in verify.stdout


def _serving_marks(repository: Path) -> dict[str, str]:
    """version -> its serving mark in `repo history` ("*", "* pinned" or "")."""
    table = _serval("repo", "history", "clf", "--repository", str(repository),
                    "--format", "md").stdout.splitlines()[2:]
    return {row.split("|")[1].strip(): row.split("|")[2].strip() for row in table}


def test_a_pin_shows_warns_on_publish_and_is_released(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    repository = tmp_path / "repo"
    _publish_linears(tmp_path, repository, [1, 2])
    server = server_factory(repository, "--poll-interval-s", "0.1")
    assert _serval("repo", "rollback", "clf", "--repository", str(repository)).returncode == 0
    _wait_for_version(server, "1")
    assert _serving_marks(repository) == {"1": "* pinned", "2": ""}
    built = fixture_models.linear(tmp_path / "build3", seed=3)
    published = _serval("repo", "publish", "--create", str(built), "--repository", str(repository),
                        "--model", "clf")
    assert published.returncode == 0 and "published clf version 3" in published.stdout
    assert published.stderr.strip() == (
        "warning: clf is pinned to version 1 (repo rollback), so version 3 does not serve; "
        "`serval repo unpin clf` serves the latest")
    assert _version(server) == "1"
    released = _serval("repo", "unpin", "clf", "--repository", str(repository))
    assert released.returncode == 0
    assert released.stdout.strip() == ("clf: pin on version 1 released; version 3 (the "
                                       "latest) serves")
    _wait_for_version(server, "3")
    assert _serving_marks(repository) == {"1": "", "2": "", "3": "*"}
    again = _serval("repo", "unpin", "clf", "--repository", str(repository))
    assert again.stdout.strip() == "clf was not pinned; version 3 (the latest) serves"


def test_a_snapshot_restores_what_served_in_one_command(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    repository = tmp_path / "repo"
    _publish_linears(tmp_path, repository, [1, 2])
    server = server_factory(repository, "--poll-interval-s", "0.1")
    taken = _serval("repo", "snapshot", "--repository", str(repository), "--name", "good")
    assert taken.returncode == 0 and taken.stdout.strip() == "snapshot 'good': 1 model(s) clf v2"
    _publish_linears(tmp_path, repository, [3])
    _wait_for_version(server, "3")
    listed = _serval("repo", "snapshots", "--repository", str(repository), "--format", "json")
    assert [row["snapshot"] for row in json.loads(listed.stdout)] == ["good"]
    restored = _serval("repo", "restore", "good", "--repository", str(repository))
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout.strip() == "restored snapshot 'good': clf v2"
    _wait_for_version(server, "2")
    assert _serving_marks(repository)["2"] == "* pinned"
    missing = _serval("repo", "restore", "nope", "--repository", str(repository))
    assert missing.returncode == 2
    assert missing.stderr.strip() == ("serval: no snapshot 'nope' (`serval repo snapshots` "
                                      "lists them)")


def test_verify_says_which_versions_it_could_not_check(tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    _publish_linears(tmp_path, repository, [1])
    copied = fixture_models.linear(tmp_path / "by-hand", seed=2)  # a version put in by hand
    (repository / "clf" / "2").mkdir()
    for file in copied.parent.iterdir() if copied.is_file() else copied.iterdir():
        if file.is_file():
            (repository / "clf" / "2" / file.name).write_bytes(file.read_bytes())
    verify = _serval("repo", "verify", "clf", "--repository", str(repository))
    assert verify.returncode == 0
    assert verify.stdout.splitlines() == [
        "clf version 1: ok",
        "clf version 2: not checked: no manifest (not published with `serval repo publish`)"]


def test_repo_cli_failures_are_one_line(tmp_path: Path) -> None:
    result = _serval("repo", "rollback", "nope", "--repository", str(tmp_path))
    assert result.returncode == 2 and "no such model" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def _wait_for_version(server: RunningServer, version: str, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while _version(server) != version:
        assert time.monotonic() < deadline, f"version {version} never started serving"
        time.sleep(0.05)
