"""`tracediag hang DUMPS...`: who broke the collective order of a hung or desynchronised job."""

from __future__ import annotations

import re

import click
import orjson

from tracediag.cli.common import EXIT_FINDING, FilePath, InputError
from tracediag.errors import TracediagError
from tracediag.output import refuse_inputs, write_atomic


@click.command()
@click.argument("dumps", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text", show_default=True)
@click.option("-o", "--output", type=FilePath(dir_okay=False), help="Write the report to this file.")
@click.option("--world-size", type=click.IntRange(min=1), help="The job's number of ranks, if no dump says it.")
@click.option("--rank-from-filename", metavar="REGEX", help="Regex whose first group is a dump's rank.")
@click.option(
    "--traces",
    "traces",
    multiple=True,
    metavar="KINETO",
    help="A profiler (Kineto JSON) trace of the same job, or a directory or glob of them (repeatable): joined to "
    "the dumps to say what the late rank's host did.",
)
def hang(
    dumps: tuple[str, ...],
    fmt: str,
    output: str | None,
    world_size: int | None,
    rank_from_filename: str | None,
    traces: tuple[str, ...],
) -> None:
    """Read PyTorch Flight Recorder dumps (one per rank: files, directories, globs, URLs) and say which
    rank broke the collective order and who waits for whom; with --traces, what the late rank's host was
    doing after its last completed collective.

    Exit status: 0 consistent, 3 a hang or desync found, 2 bad input.
    """
    from tracediag.desync import hang as run_hang
    from tracediag.report.hang_report import render_hang_page, render_hang_text

    try:
        report = run_hang(
            list(dumps),
            world_size=world_size,
            rank_from_filename=rank_from_filename,
            traces=list(traces) if traces else None,
        )
    except TracediagError as e:
        raise InputError(str(e).replace("\n\n", " ").replace("\n", " ")) from None
    except re.error as e:
        msg = f"--rank-from-filename: not a regex ({e})"
        raise InputError(msg) from None
    if fmt == "json":
        text = orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2).decode()
    elif fmt == "html":
        text = render_hang_page(report)
    else:
        text = render_hang_text(report)
    if output:
        try:
            refuse_inputs(output, [*dumps, *traces], "-o")
            write_atomic(output, (text + "\n").encode())
        except TracediagError as e:
            raise InputError(str(e)) from None
    else:
        click.echo(text)
    if report.found:
        raise SystemExit(EXIT_FINDING)
