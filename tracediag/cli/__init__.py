"""The `tracediag` command line: one module per command, registered here."""

from __future__ import annotations

import os
import sys

import click


@click.group()
@click.version_option(package_name="tracediag")
def cli() -> None:
    """Find where a multi-GPU training run waits, predict what it should achieve, plan its split."""


def _register() -> None:
    from tracediag.cli.analyze import analyze
    from tracediag.cli.calibrate import calibrate
    from tracediag.cli.compare import compare
    from tracediag.cli.hang import hang
    from tracediag.cli.ingest import ingest
    from tracediag.cli.model import register as register_model
    from tracediag.cli.report import report
    from tracediag.cli.watch import watch

    cli.add_command(ingest)
    cli.add_command(analyze)
    cli.add_command(compare)
    register_model(cli)
    cli.add_command(calibrate)
    cli.add_command(report)
    cli.add_command(watch)
    cli.add_command(hang)


_register()


def main() -> None:
    """Console-script entry point.

    Bad input and options exit 2 with one line (click and `InputError`). Anything else is a bug in
    tracediag: it too gets one line and exit status 1, with the traceback when TRACEDIAG_DEBUG is set.
    """
    try:
        cli()
    except Exception as e:
        if os.environ.get("TRACEDIAG_DEBUG"):
            raise
        click.echo(
            f"Error: internal error ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
            "rerun with TRACEDIAG_DEBUG=1 for the traceback, and please report it",
            err=True,
        )
        sys.exit(1)
