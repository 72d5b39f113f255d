"""The `serval` command line: version, model listing, whole help pages, one-line failures."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from serval.cli.main import app
from tests import fixture_models
from tests.conftest import free_port

pytestmark = pytest.mark.integration


def _serval(*args: str, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"COLUMNS": str(columns)} if columns else {})}
    return subprocess.run([sys.executable, "-m", "serval", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def _on_a_terminal(args: list[str], columns: int) -> str:
    """Run `serval ARGS` with a pseudo-terminal of COLUMNS as its stdout; its text, unstyled."""
    main, side = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm"}
    process = subprocess.Popen([sys.executable, "-m", "serval", *args], stdout=side,
                               stderr=side, stdin=subprocess.DEVNULL, env=env)
    os.close(side)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    assert process.wait(timeout=60) == 0
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode())


def _commands(command: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[list[str],
                                                                                 list[str]]]:
    """Every command and group of the real app: (its words, its option names)."""
    command = command or typer.main.get_command(app)
    context = command.make_context("serval", [], resilient_parsing=True)
    names = [name for param in command.get_params(context)
             for name in (*param.opts, *param.secondary_opts) if name.startswith("-")]
    yield list(path), names
    for name in getattr(command, "commands", {}):
        yield from _commands(command.commands[name], (*path, name))


COMMANDS = list(_commands())


@pytest.mark.parametrize(("words", "options"), COMMANDS, ids=[" ".join(w) or "serval"
                                                              for w, _ in COMMANDS])
def test_help_keeps_every_option_name_whole_at_80_columns(words: list[str],
                                                          options: list[str]) -> None:
    piped = _serval(*words, "--help", columns=80)
    assert piped.returncode == 0, piped.stderr
    for text in (piped.stdout, _on_a_terminal([*words, "--help"], 80)):
        assert "\u2026" not in text  # rich's mark of a cut cell
        assert max(len(line) for line in text.splitlines()) <= 80
        for option in options:
            assert re.search(rf"(^|[\s,]){re.escape(option)}([\s,]|$)", text, re.M), option


def test_version() -> None:
    result = _serval("--version")
    assert result.returncode == 0 and result.stdout.startswith("serval ")


def test_ctrl_c_while_the_command_line_imports_is_one_line() -> None:
    """Ctrl-C in the first second (typer, rich, numpy importing) made a traceback from
    whichever import it hit. The interrupt is raised where the import begins, every time."""
    interrupt_the_import = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'serval.cli.main': raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "sys.argv = ['serval', '--version']\n"
        "import runpy; runpy.run_module('serval', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", interrupt_the_import], capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stderr) == (130, "serval: interrupted\n")


def test_models_list_shows_valid_and_invalid_configs(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    fixture_models.add_sub(tmp_path, name="bad", config="max_batch_size: -3\n")
    result = _serval("models", "list", "--repository", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "linear" in result.stdout and "32" in result.stdout
    assert "invalid" in result.stdout and "max_batch_size" in result.stdout


def test_models_list_fits_80_columns_with_a_yaml_error_on_one_line(tmp_path: Path) -> None:
    fixture_models.linear(tmp_path)
    fixture_models.add_sub(tmp_path, name="bad_config", config="max_batch_size: [\n")
    table = _serval("models", "list", "--repository", str(tmp_path), columns=80)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert max(map(len, lines)) <= 80, table.stdout
    status = " ".join(line.split("\u2502")[6].strip() for line in lines
                      if line.count("\u2502") == 7)
    assert "not valid YAML: while parsing a flow node did not find expected node" in status, \
        table.stdout
    assert "linear" in table.stdout and "bad_config" in table.stdout


def test_models_list_and_repo_history_keep_values_whole_when_piped(tmp_path: Path) -> None:
    models = tmp_path / "models"
    long_name = "a-model-whose-name-is-longer-than-any-column-an-80-column-table-could-give"
    fixture_models.linear(models, name=long_name)
    fixture_models.add_sub(models, name="bad", config="max_batch_size: -3\n")
    table = _serval("models", "list", "--repository", str(models), columns=80)
    assert table.returncode == 0, table.stderr
    assert long_name in table.stdout and "\u2026" not in table.stdout
    rows = json.loads(_serval("models", "list", "-r", str(models), "--format", "json").stdout)
    assert {r["model"]: r["max_batch_size"] for r in rows} == {long_name: 32, "bad": None}
    assert "max_batch_size" in next(r["status"] for r in rows if r["model"] == "bad")
    md = _serval("models", "list", "-r", str(models), "--format", "md").stdout.splitlines()
    assert md[0] == "| model | versions | backend | max batch | instances | status |"
    assert f"| {long_name} | 1 | onnxruntime | 32 | 1 | ok |" in md

    repository = tmp_path / "repo"
    source = next(models.glob(f"{long_name}/1/*.onnx"))
    note = "exported-from-a-notebook-by-someone-who-writes-long-provenance-notes"
    assert _serval("repo", "publish", "--create", str(source), "-r", str(repository), "-m", "clf",
                   "--note", note).returncode == 0
    history = _serval("repo", "history", "clf", "-r", str(repository), columns=80)
    assert history.returncode == 0 and note in history.stdout, history.stdout
    (record,) = json.loads(_serval("repo", "history", "clf", "-r", str(repository),
                                   "--format", "json").stdout)
    assert record["version"] == "1" and record["serving"] is True and record["source"] == note
    assert record["created"] in history.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--repository", "/no/such/dir"], "is not a directory"),
        (["models", "list", "--repository", "/no/such/dir"], "not found"),
        (["loadtest", "http://127.0.0.1:9", "-m", "m", "--duration", "3x"],
         "'3x' is not a duration"),
        (["loadtest", "http://127.0.0.1:9", "-m", "m", "--timeout", "0ms"], "must be > 0"),
        (["tune", "-r", "/tmp", "-m", "m", "--slo-p99-ms", "5", "--budget", "ten"],
         "'ten' is not a duration"),
        (["serve", "-r", "/tmp", "--header-timeout-s", "2q"], "'2q' is not a duration"),
        (["plan", "x.json", "--slo-p99-ms", "fast"], "'fast' is not a duration"),
        (["serve"], "Missing option '--repository'"),
        (["serve", "-r", "/tmp", "--http-port", "http"], "--http-port"),
        (["nosuch"], "No such command 'nosuch'"),
        (["models", "list", "-r", "/tmp", "--format", "xml"], "'xml' is not one of"),
        (["repo", "verify", "--repository", "/no/such/dir"], "directory not found"),
        (["token", "create", "--tokens-file", "/no/such/dir/t.yaml", "--scope", "read"],
         "cannot write /no/such/dir/t.yaml"),
        (["serve", "-r", "/tmp", "--tls-cert", "/no/cert.pem", "--tls-key", "/no/key.pem"],
         "cannot load them"),
        (["serve", "-r", "/tmp", "--tls-cert", "/no/cert.pem"], "go together"),
        (["serve", "-r", "/tmp", "--load-model", "m"], "--load-model needs --model-control "
         "explicit"),
        (["serve", "-r", "/tmp", "--trace-config", "level=TIMESTAMPS"],
         "tracing needs a trace file"),
        (["serve", "-r", "/tmp", "--trace-file", "/tmp/t.json", "--trace-config", "rate=0"],
         "'trace_rate' must be an integer >= 1"),
        (["serve", "-r", "/tmp", "--trace-config", "sample=3"], "takes SETTING=VALUE"),
        (["serve", "-r", "/tmp", "--trace-file", "/no/such/dir/t.json"], "does not exist"),
        (["serve", "-r", "/tmp", "--trace-file", "/tmp/t.json", "--workers", "2"],
         "--trace-file needs --workers 1"),
        (["serve", "-r", "/tmp", "--model-repository", "/tmp"], "not both"),
        (["serve", "--model-repository", "/tmp", "--model-control-mode", "sometimes"],
         "--model-control-mode takes none, poll or explicit (Triton's), got 'sometimes'"),
        (["serve", "--model-repository=/tmp", "--allow-http=false"],
         "--allow-http=false: this server always serves HTTP"),
        (["serve", "--model-repository=/tmp", "--strict-model-config=maybe"],
         "--strict-model-config takes true or false (Triton's flag), got 'maybe'"),
        (["serve", "-r", "/tmp", "--model-control", "sometimes"],
         "model_control: Input should be 'all', 'lazy' or 'explicit'"),
        (["serve", "-r", "/tmp", "--cache-config", "redis,host=localhost"],
         "--cache-config takes local,size=BYTES"),
        (["serve", "-r", "/tmp", "--cache-config", "local,size=lots"],
         "size 'lots' is not a size in bytes"),
        (["tune", "-r", "/tmp", "-m", "m", "--slo-p99-ms", "0"],
         "--slo-p99-ms 0: expected a latency above 0"),
        (["tune", "-r", "/tmp", "-m", "m", "--slo-p99-ms", "5", "--workers", "1,1000"],
         "--workers '1,1000': expected 1 to 64"),
        (["tune", "-r", "/tmp", "-m", "m", "--slo-p99-ms", "5", "--instances", "0"],
         "--instances '0': expected 1 to 64"),
        (["tune", "-r", "/tmp", "-m", "m", "--slo-p99-ms", "5", "--threads", "5000"],
         "--threads '5000': expected 0 to 1,024"),
    ],
)
def test_failures_exit_non_zero_with_one_line(args: list[str], message: str) -> None:
    result = _serval(*args)
    assert result.returncode != 0
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_loading_an_unknown_model_at_start_fails_with_one_line(tmp_path: Path) -> None:
    result = _serval("serve", "-r", str(tmp_path), "--model-control", "explicit",
                     "--load-model", "no_such_model", "--http-port", "0", "--grpc-port", "0",
                     "--log-level", "error")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "serval: --load-model no_such_model: no model folder of that name in the repository"]


def test_broken_files_fail_with_one_line(tmp_path: Path) -> None:
    """YAML errors span lines; the reason still comes as one, with no traceback."""
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.yaml").write_text("max_batch_size: [\n")
    (tmp_path / "tokens.yaml").write_text("tokens: [\n")
    (tmp_path / "cert.pem").write_text("not a certificate\n")
    for args, message in (
        (["tune", "-r", str(tmp_path), "-m", "m", "--slo-p99-ms", "5"], "not valid YAML"),
        (["token", "create", "--tokens-file", str(tmp_path / "tokens.yaml"), "--scope",
          "read"], "cannot read tokens"),
        (["serve", "-r", str(tmp_path), "--tls-cert", str(tmp_path / "cert.pem"),
          "--tls-key", str(tmp_path / "cert.pem")], "cannot load them"),
    ):
        result = _serval(*args)
        assert result.returncode != 0 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("flag", ["--http-port", "--grpc-port"])
def test_serve_fails_clearly_when_a_port_is_taken(tmp_path: Path, flag: str) -> None:
    """The taken port and its flag are named on one line, before any model loads (a load
    would log a line)."""
    import socket

    fixture_models.linear(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        other = "--grpc-port" if flag == "--http-port" else "--http-port"
        result = _serval("serve", "--repository", str(tmp_path), flag, port, other,
                         str(free_port()))
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port} ({flag})" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
