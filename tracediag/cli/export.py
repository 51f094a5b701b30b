"""`tracediag export`: every rank's timeline in one Perfetto / chrome://tracing file, with the analysis
drawn on it (docs/perfetto.md); also what `analyze --perfetto FILE` writes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from tracediag.cli.common import FilePath, InputError
from tracediag.cli.execute_options import refuse_overwrite, run_summaries
from tracediag.cli.traces import (
    allow_missing_option,
    exit_if_missing,
    parse_rank_map,
    reading_progress,
    report_read_errors,
    trace_options,
)
from tracediag.errors import TracediagError, shown
from tracediag.report.perfetto_limits import DEFAULT_MAX_EVENTS, parse_ranks
from tracediag.units import count

if TYPE_CHECKING:
    from tracediag.analysis import Analysis
    from tracediag.run import Run


def _ranks(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return parse_ranks(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None


def perfetto_options(f):
    """``--ranks`` and ``--max-events``: what a Perfetto file of a large run keeps."""
    f = click.option(
        "--max-events",
        type=click.IntRange(min=1),
        default=DEFAULT_MAX_EVENTS,
        show_default=True,
        help="Timeline events written at most (the shortest are left out beyond it, and the file says so).",
    )(f)
    return click.option(
        "--ranks",
        "export_ranks",
        metavar="0,3,5-7",
        callback=_ranks,
        help="Write only these ranks' timelines and annotations (default: every rank).",
    )(f)


def write_trace(
    path: str, run: Run, analysis: Analysis, *, ranks: tuple[int, ...] | None, max_events: int, step_regex: str | None
) -> None:
    """Write the Perfetto file, say so on stderr with what was left out; bad options and unwritable
    files as one line (exit 2)."""
    from tracediag.report.perfetto import write_perfetto

    try:
        exported = write_perfetto(path, run, analysis, ranks=ranks, max_events=max_events, step_regex=step_regex)
    except (TracediagError, ValueError) as e:
        msg = f"{shown(path)}: {e}"
        raise InputError(msg) from None
    click.echo(f"wrote {shown(path)} ({exported.events:,} events, {count(len(exported.ranks), 'rank')})", err=True)
    if exported.warning():
        click.echo(f"Warning: {exported.warning()}", err=True)


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--output", type=FilePath(dir_okay=False), required=True, help="The trace file to write (.json).")
@click.option("--step-regex", metavar="REGEX", help=r"Step markers other than ProfilerStep#N, e.g. '^step (\d+)$'.")
@perfetto_options
@trace_options
@allow_missing_option
def export(
    paths: tuple[str, ...],
    output: str,
    step_regex: str | None,
    export_ranks: tuple[int, ...] | None,
    max_events: int,
    jobs: int,
    rank_from_filename: str | None,
    rank_map: tuple[str, ...],
    comm_kernel: str | None,
    allow_missing: bool,
) -> None:
    """Write trace files' timelines, aligned and annotated with the analysis, to one file for ui.perfetto.dev."""
    from tracediag.execute.driver import analyze_sources

    n_files = len(refuse_overwrite(paths, {"-o": output}))
    kw: dict[str, Any] = {
        "jobs": jobs,
        "rank_from_filename": rank_from_filename,
        "rank_map": parse_rank_map(rank_map),
        "comm_kernel": comm_kernel,
        "events": True,
        "on_read": report_read_errors,
    }
    with reading_progress(n_files) as on_file_done:
        analysed = run_summaries(analyze_sources, paths, step_regex=step_regex, on_file_done=on_file_done, **kw)
    (_, analysis), run = analysed.results[0], analysed.run
    write_trace(output, run, analysis, ranks=export_ranks, max_events=max_events, step_regex=step_regex)
    exit_if_missing(analysed.failed, allow_missing)
