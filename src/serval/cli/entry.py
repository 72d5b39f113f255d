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
    if sys.argv[1:2] == ["serve"]:  # a tritonserver command line works too
        from serval.cli.triton_flags import translate

        try:
            sys.argv[2:], notes = translate(sys.argv[2:])
        except ValueError as exc:
            sys.stderr.write(f"serval: {exc}\n")
            sys.exit(2)  # a usage error, as click's
        for note in notes:
            sys.stderr.write(f"serval: {note}\n")
    app()
