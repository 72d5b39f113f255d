"""`python -m serval` runs the command line."""

from serval.cli.entry import main

main()
