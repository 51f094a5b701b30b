"""The `tracediag` command line: one module per command, registered here."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="tracediag")
def cli() -> None:
    """Find where a multi-GPU training run waits, predict what it should achieve, plan its split."""


def _register() -> None:
    from tracediag.cli.ingest import ingest

    cli.add_command(ingest)
    from tracediag.cli.analyze import analyze

    cli.add_command(analyze)
    from tracediag.cli.model import register as register_model

    register_model(cli)
    from tracediag.cli.report import report

    cli.add_command(report)


_register()


def main() -> None:
    """Console-script entry point."""
    cli()
