"""`tracediag report analysis.json -o report.html`: the HTML report of a saved analysis."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson
import polars as pl

from tracediag.analysis import Analysis
from tracediag.cli.common import FilePath, InputError, regular_file
from tracediag.errors import TracediagError, one_line, shown
from tracediag.output import refuse_inputs, write_atomic

if TYPE_CHECKING:
    from tracediag.run import Run


def write_html(
    analysis: Analysis,
    path: Path,
    source: Path | None = None,
    *,
    run: Run | None = None,
    step_regex: str | None = None,
) -> None:
    """Write the HTML report and say on stderr where and how large it is.

    `source`: the analysis.json it was read from; a section of the wrong shape there (a hand-edited
    file) is a one-line error naming it. `run`: the events analysed, for the per-stream timelines.
    """
    from tracediag.report.html import render_html

    try:
        data = render_html(analysis, run=run, step_regex=step_regex).encode()
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if source is None:
            raise
        why = one_line(f"{type(e).__name__}: {e}")
        msg = f"{shown(source)}: not a tracediag analysis (a section has the wrong shape: {why})"
        raise InputError(msg) from None
    try:
        write_atomic(path, data)
    except TracediagError as e:
        raise InputError(str(e)) from None
    click.echo(f"wrote {path} ({len(data) / 1e6:.1f} MB, self-contained)", err=True)


def read_analysis(path: Path) -> Analysis:
    """An analysis saved by `tracediag analyze --format json`."""
    try:
        return Analysis.from_dict(orjson.loads(path.read_bytes()))
    except (OSError, KeyError, TypeError, ValueError, AttributeError, OverflowError, pl.exceptions.PolarsError) as e:
        why = one_line(f"{type(e).__name__}: {e}" if isinstance(e, (KeyError, AttributeError)) else str(e))
        hint = "write one with `tracediag analyze --format json -o FILE`"
        msg = f"{shown(path)}: not a tracediag analysis ({why}). Hint: {hint}"
        raise InputError(msg) from None


@click.command()
@click.argument("analysis_json", type=FilePath(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "-o", "--output", type=FilePath(dir_okay=False, path_type=Path), required=True, help="The HTML file to write."
)
def report(analysis_json: Path, output: Path) -> None:
    """Render a saved analysis (`analyze --format json`) as one self-contained HTML file."""
    regular_file(analysis_json, "the analysis")
    try:
        refuse_inputs(output, [analysis_json], "-o")
    except TracediagError as e:
        raise InputError(str(e)) from None
    write_html(read_analysis(analysis_json), output, source=analysis_json)
