"""Entry point of the `serval` command line."""

from __future__ import annotations

import typer

from serval import __version__
from serval.cli import cluster, loadtest, models, optimize, plan, repo, report, serve, token, tune
from serval.cli.command import ServalCommand, ServalGroup

app = typer.Typer(
    name="serval",
    cls=ServalGroup,
    help="Serval: a fast, cheap KServe v2 inference server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("serve", cls=ServalCommand)(serve.serve_command)
app.command("optimize", cls=ServalCommand)(optimize.optimize_command)
app.command("loadtest", cls=ServalCommand)(loadtest.loadtest_command)
app.command("report", cls=ServalCommand)(report.report_command)
app.command("tune", cls=ServalCommand)(tune.tune_command)
app.command("plan", cls=ServalCommand)(plan.plan_command)
app.add_typer(models.app, name="models")
app.add_typer(repo.app, name="repo")
app.add_typer(token.app, name="token")
app.add_typer(cluster.app, name="cluster")


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"serval {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Serve, inspect and measure models over the KServe v2 protocol."""
