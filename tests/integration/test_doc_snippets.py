"""Every shell and Python snippet of the README and docs/ either runs here, as written, against
a real server serving the example models, or says in the page why it cannot (a marker comment
`<!-- snippet: not run: REASON -->` on the line before its fence). A snippet added without a
marker runs, so none rots unseen.

Snippets address the server as the README does (localhost:8000 / 8001); those addresses are
rewritten to the test server's ports, nothing else. A snippet passes when it exits 0 within its
time and prints no `"error"` (a v2 error body). The README's opening set-up block is the one
snippet known here rather than marked (the README starts with its two commands)."""

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
FENCE = re.compile(r"(?:<!-- snippet: (?P<note>[^\n]*?) -->\n)?^```(?P<lang>bash|sh|shell|python)"
                   r"\n(?P<body>.*?)^```$", re.S | re.M)
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


@pytest.fixture(scope="module")
def examples(server_factory: Callable[..., RunningServer]) -> RunningServer:
    return server_factory(EXAMPLES, "--allow-python-models")


@pytest.mark.parametrize("snippet", RUN, ids=[s.name for s in RUN])
def test_the_snippet_runs_as_written(snippet: Snippet, examples: RunningServer,
                                     tmp_path: Path) -> None:
    body = snippet.body
    for host in ("localhost", "127.0.0.1"):
        body = body.replace(f"{host}:8000", f"127.0.0.1:{examples.port}")
        body = body.replace(f"{host}:8001", f"127.0.0.1:{examples.grpc_port}")
    bin_dir = str(Path(sys.executable).parent)  # `serval` and `python3` of this environment
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1"}
    command = ([sys.executable, "-c", body] if snippet.lang == "python"
               else ["bash", "-euo", "pipefail", "-c", body])
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                          cwd=tmp_path, env=env)
    shown = f"{snippet.name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, shown
    assert '"error"' not in done.stdout, shown
