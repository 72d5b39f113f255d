"""The `serval` command's entry point. Ctrl-C while the command line is still being imported
(a second or so: typer, rich, numpy) ends it with the same one line as during a command, not a
traceback from whichever import it interrupted."""

from __future__ import annotations

import sys

from serval.cli import INTERRUPTED


def main() -> None:
    try:
        from serval.cli.main import app
    except KeyboardInterrupt:
        sys.stderr.write("serval: interrupted\n")
        sys.exit(INTERRUPTED)
    app()
