"""Every shell and Python snippet of the README and docs/ either runs here, as written, against
a real server serving the example models, or says in the page why it cannot (a marker comment
`<!-- snippet: not run: REASON -->` on the line before its fence). A snippet added without a
marker runs, so none rots unseen. Every fence names its language; a `console` fence is a
transcript: each `$ ` command runs, and the first line of the output shown under it must still
come out in that form (numbers may differ: the box is noisy).

Snippets address the server as the README does (localhost:8000 / 8001); those addresses are
rewritten to the test server's ports, nothing else. The snippets of one page share a working
directory, in page order (a page may write a file one snippet and read it the next), where
`examples/` is this checkout's. A bash or Python snippet passes when it exits 0 within its time
and prints no `"error"` (a v2 error body). The README's opening set-up block is the one snippet
known here rather than marked (the README starts with its two commands)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ROOT, RunningServer

pytestmark = pytest.mark.integration

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(?:<!-- snippet: (?P<note>[^\n]*?) -->\n)?^```(?P<lang>bash|sh|shell|python|"
                   r"console)\n(?P<body>.*?)^```$", re.S | re.M)
ANY_FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```$", re.S | re.M)
NUMBER = re.compile(r"\d[\d,.]*")
TIMEOUT_S = 120
SETUP_NOTE = ("not run: the README's set-up commands (`make test` is this suite; `make serve` "
              "starts the server the other snippets run against)")


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    lang: str
    body: str
    note: str | None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def _snippets() -> list[Snippet]:
    found = []
    for path in PAGES:
        text = path.read_text()
        for match in FENCE.finditer(text):
            note = match["note"]
            if note is None and path.name == "README.md" and match["body"].startswith(
                    "make serve"):  # the README opens with its two commands, nothing before
                note = SETUP_NOTE
            found.append(Snippet(str(path.relative_to(ROOT)), text.count("\n", 0, match.start(
                "lang")) + 1, match["lang"], match["body"], note))
    return found


SNIPPETS = _snippets()
RUN = [s for s in SNIPPETS if s.note is None]


def test_the_pages_have_snippets_and_each_is_run_or_says_why_not() -> None:
    assert len(SNIPPETS) >= 10 and len(RUN) >= 3
    unexplained = [s.name for s in SNIPPETS
                   if s.note is not None and not re.fullmatch(r"not run: \S.{8,}", s.note)]
    assert unexplained == [], "a marker must say `not run: <why>`"


def test_every_fence_names_its_language_and_only_console_fences_hold_transcripts() -> None:
    """A bare fence could hide a command from the runner; a `$ ` line outside a console fence
    would be a transcript nobody runs."""
    bad = []
    for path in PAGES:
        text = path.read_text()
        for match in ANY_FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            if not match["lang"]:
                bad.append(f"{path.name}:{line}: fence without a language")
            elif match["lang"] != "console" and re.search(r"^\$ ", match["body"], re.M):
                bad.append(f"{path.name}:{line}: `$ ` lines in a {match['lang']} fence")
    assert bad == []


def transcript(body: str) -> list[tuple[str, list[str]]]:
    """A console fence's (command, output lines shown under it) pairs; `\\` continues a
    command on the next line."""
    steps: list[tuple[str, list[str]]] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            command = lines[i][2:]
            while command.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                command += "\n" + lines[i]
            steps.append((command, []))
        elif steps:
            steps[-1][1].append(lines[i])
        i += 1
    return steps


def shape(line: str) -> re.Pattern[str]:
    """A shown output line as a pattern: its words exactly, any number where it has one, any
    run of spaces where it has one; it may continue (a page wraps long lines)."""
    parts = []
    for piece in re.split(r"(\d[\d,.]*|\s+)", line.strip()):
        if NUMBER.fullmatch(piece):
            parts.append(r"\d[\d,.]*")
        elif piece.isspace():
            parts.append(r"\s+")
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts))


@pytest.mark.unit
def test_a_shown_line_matches_other_figures_but_not_other_words() -> None:
    shown = "generator ceiling: 64,435 req/s against a trivial endpoint"
    assert shape(shown).match("generator ceiling: 1,024.5 req/s against a trivial endpoint x")
    assert not shape(shown).match("generator ceiling: 1,024 items/s against a trivial endpoint")
    assert transcript("$ a \\\n  b\nout 1\n$ c\n") == [("a \\\n  b", ["out 1"]), ("c", [])]


@pytest.fixture(scope="module")
def examples(server_factory: Callable[..., RunningServer]) -> RunningServer:
    return server_factory(EXAMPLES, "--allow-python-models")


@pytest.fixture(scope="module")
def page_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    dirs = {page: tmp_path_factory.mktemp("page") for page in {s.page for s in RUN}}
    for where in dirs.values():  # `examples/...` in a snippet is this checkout's
        (where / "examples").symlink_to(ROOT / "examples")
    return dirs


def _as_here(body: str, server: RunningServer) -> str:
    for host in ("localhost", "127.0.0.1"):
        body = body.replace(f"{host}:8000", f"127.0.0.1:{server.port}")
        body = body.replace(f"{host}:8001", f"127.0.0.1:{server.grpc_port}")
    return body


def _run(lang: str, body: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = str(Path(sys.executable).parent)  # `serval` and `python3` of this environment
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    command = ([sys.executable, "-c", body] if lang == "python"
               else ["bash", "-euo", "pipefail", "-c", body])
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd,
                          env=env)


@pytest.mark.parametrize("snippet", RUN, ids=[s.name for s in RUN])
def test_the_snippet_runs_as_written(snippet: Snippet, examples: RunningServer,
                                     page_dirs: dict[str, Path]) -> None:
    cwd = page_dirs[snippet.page]
    if snippet.lang == "console":
        for command, shown in transcript(snippet.body):
            done = _run("bash", _as_here(command, examples), cwd)
            said = f"{snippet.name}: `{command}` exited {done.returncode}:\n{done.stdout}\n" \
                   f"{done.stderr}"
            assert done.returncode == 0, said
            first = next((line for line in shown if line.strip()), None)
            if first is not None:
                answer = [line.strip() for line in (done.stdout + done.stderr).splitlines()]
                assert any(shape(first).match(line) for line in answer), \
                    f"{said}\nexpected a line shaped like: {first}"
        return
    done = _run(snippet.lang, _as_here(snippet.body, examples), cwd)
    shown = f"{snippet.name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, shown
    assert '"error"' not in done.stdout, shown
