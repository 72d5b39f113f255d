"""`python -m serval` runs the command line."""

from serval.cli.main import app

app()
