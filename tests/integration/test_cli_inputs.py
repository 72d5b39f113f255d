"""Bad command-line input: each is refused with one line and a non-zero exit, before anything
is changed or started (no traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def serval(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "serval", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=cwd)


def assert_one_line(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--h2-stream-window-kb", "1e12"], "--h2-stream-window-kb: transport limit "
         "h2_stream_window_bytes must be at most 2,147,483,647"),
        (["--h2-connection-window-mb", "4096"], "must be at most 2,147,483,647"),
        (["--receive-budget-mb", "inf"], "'--receive-budget-mb': inf is not a finite number"),
        (["--receive-budget-mb", "nan"], "nan is not a finite number"),
        (["--max-request-mb", "-inf"], "-inf is not a finite number"),
        (["--header-timeout-s", "9" * 400], "inf is not a finite number"),
    ],
)
def test_serve_refuses_limits_beyond_range(tmp_path: Path, args: list[str], message: str
                                           ) -> None:
    assert_one_line(serval("serve", "-r", str(tmp_path), "--http-port", "0", "--grpc-port",
                           "0", *args), message)


def test_a_tokens_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_bytes(b"\xff\xfe")
    (tmp_path / "r").mkdir()
    for args in (["token", "create", "--tokens-file", str(tokens), "--scope", "read"],
                 ["serve", "-r", str(tmp_path / "r"), "--http-port", "0", "--grpc-port", "0",
                  "--auth-tokens", str(tokens)]):
        assert_one_line(serval(*args), "cannot read tokens: not UTF-8 text")
    assert tokens.read_bytes() == b"\xff\xfe"


@pytest.mark.parametrize("server", ["not a url", "localhost:abc", "[::1", "ftp://host:1",
                                    "localhost", "localhost:70000", "localhost:1/path"])
@pytest.mark.parametrize("command", ["publish", "rollback", "unpin", "restore"])
def test_repo_refuses_a_malformed_server_before_changing_anything(
        tmp_path: Path, command: str, server: str) -> None:
    source = tmp_path / "model.onnx"
    source.write_bytes(b"onnx")
    repository = tmp_path / "repo"
    repository.mkdir()
    args = {"publish": ["publish", str(source), "-m", "m"], "rollback": ["rollback", "m"],
            "unpin": ["unpin", "m"], "restore": ["restore", "snap"]}[command]
    result = serval("repo", *args, "-r", str(repository), "--server", server)
    assert_one_line(result, "Invalid value for '--server'")
    assert list(repository.iterdir()) == []


def test_repo_publish_refuses_nothing_to_publish_and_a_missing_repository(tmp_path: Path
                                                                          ) -> None:
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    repository = tmp_path / "repo"
    repository.mkdir()
    assert_one_line(serval("repo", "publish", str(empty), "-r", str(repository), "-m", "m"),
                    "nothing to publish (the folder holds no model file)")
    assert list(repository.iterdir()) == []
    source = tmp_path / "model.onnx"
    source.write_bytes(b"onnx")
    typo = tmp_path / "typo" / "repo"
    assert_one_line(serval("repo", "publish", str(source), "-r", str(typo), "-m", "m"),
                    "model repository directory not found (--create makes a new one)")
    assert not (tmp_path / "typo").exists()
    created = serval("repo", "publish", str(source), "-r", str(typo), "-m", "m", "--create")
    assert created.returncode == 0 and (typo / "m" / "1" / "model.onnx").is_file()


def test_repo_verify_checks_every_version_past_a_broken_manifest(tmp_path: Path) -> None:
    source = tmp_path / "model.onnx"
    source.write_bytes(b"onnx")
    repository = tmp_path / "repo"
    for _ in range(3):
        serval("repo", "publish", str(source), "-r", str(repository), "-m", "m", "--create")
    (repository / "m" / "1" / "manifest.json").write_text("{not json")
    (repository / "m" / "2" / "manifest.json").write_text("[1, 2]")
    result = serval("repo", "verify", "-r", str(repository))
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines() == [
        "m version 1: corrupted: manifest.json: not valid JSON",
        "m version 2: corrupted: manifest.json: not a JSON object",
        "m version 3: ok"]


@pytest.mark.parametrize(("args", "message"), [
    (["--http-port", "70000"], "--http-port 70000 is outside 1-65535"),
    (["--stats-port", "99999"], "--stats-port 99999 is outside 1-65535"),
    (["--node-http-port", "70000"], "--node-http-port 70000 is outside 1-65535"),
    (["--proxy-threads", "100000"], "proxy threads must be 1-64"),
    (["--host", "bad host"], "'bad host' is not a host name or address"),
    (["--stats-socket", "/tmp/a b"], "the stats socket path '/tmp/a b' must be"),
    (["--http-port", "8000", "--grpc-port", "8000"], "--http-port and --grpc-port are both"),
])
def test_proxy_config_refuses_what_haproxy_would(tmp_path: Path, args: list[str],
                                                 message: str) -> None:
    out = tmp_path / "haproxy.cfg"
    assert_one_line(serval("cluster", "proxy-config", "--dns", "svc.local", "-o", str(out),
                           *args), message)
    assert not out.exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--http-port", "70000"], "--http-port 70000 is outside 1-65535"),
    (["--http-port", "-1"], "--http-port -1 is outside 1-65535"),
    (["--http-port", "18547", "--proxy-threads", "100000"], "proxy threads must be 1-64"),
])
def test_cluster_up_refuses_bad_proxy_settings_before_starting(
        tmp_path: Path, args: list[str], message: str) -> None:
    import tempfile

    port = args[1]
    state = Path(tempfile.gettempdir()) / f"serval-cluster-{port}"
    assert not state.exists()
    assert_one_line(serval("cluster", "up", "-r", str(tmp_path), "--nodes", "1", "--grpc-port",
                           "0", *args), message)
    assert not state.exists()
