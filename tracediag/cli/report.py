"""`tracediag report analysis.json -o report.html`: the HTML report of a saved analysis."""

from __future__ import annotations

from pathlib import Path

import click
import orjson

from tracediag.analysis import Analysis
from tracediag.cli.common import InputError


def write_html(analysis: Analysis, path: Path) -> None:
    """Write the HTML report and say on stderr where and how large it is."""
    from tracediag.report.html import render_html

    data = render_html(analysis).encode()
    path.write_bytes(data)
    click.echo(f"wrote {path} ({len(data) / 1e6:.1f} MB, self-contained)", err=True)


def read_analysis(path: Path) -> Analysis:
    """An analysis saved by `tracediag analyze --format json`."""
    try:
        return Analysis.from_dict(orjson.loads(path.read_bytes()))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        msg = f"{path}: not a tracediag analysis ({e}). Hint: write one with `tracediag analyze --format json -o FILE`"
        raise InputError(msg) from None


@click.command()
@click.argument("analysis_json", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), required=True, help="The HTML file to write."
)
def report(analysis_json: Path, output: Path) -> None:
    """Render a saved analysis (`analyze --format json`) as one self-contained HTML file."""
    write_html(read_analysis(analysis_json), output)
