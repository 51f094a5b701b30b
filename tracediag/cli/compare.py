"""`tracediag compare BASE NEW`: two runs side by side, with a CI gate on step time."""

from __future__ import annotations

from pathlib import Path

import click
import orjson

from tracediag.analysis import Analysis
from tracediag.cli.common import EXIT_FINDING, FilePath, Finite, InputError, Jobs
from tracediag.cli.traces import allow_missing_option, exit_if_missing, load_traces
from tracediag.compare import compare as _compare
from tracediag.errors import TracediagError, shown
from tracediag.output import refuse_inputs, write_atomic
from tracediag.report.compare_report import render_compare_html, render_compare_text
from tracediag.run import resolve_paths


def _is_analysis(path: str) -> bool:
    """A saved `analyze --format json` document (it starts with its schema version)."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open("rb") as f:
        return f.read(32).lstrip().startswith(b'{"schema_version"')


def _side(path: str, step_regex: str | None, jobs: int, allow_mixed: bool) -> tuple[Analysis, tuple[str, ...]]:
    """An analysis from a saved analysis JSON, or from trace files/directories analysed now, and the
    files of it that could not be read (named on stderr)."""
    from tracediag.reduce import analyze

    if _is_analysis(path):
        try:
            return Analysis.from_dict(orjson.loads(Path(path).read_bytes())), ()
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            msg = f"{path}: not a readable tracediag analysis ({e})"
            raise InputError(msg) from None
    run = load_traces((path,), jobs, None, ())
    try:
        return analyze(run, step_regex=step_regex, allow_mixed=allow_mixed), run.meta.errors
    except (TracediagError, ValueError) as e:
        raise InputError(f"{path}: {e}".replace("\n", "\nError: ")) from None


def _hardware(a: Analysis) -> str:
    """What the run ran on: "GPUs" when its steps ran on a device, else "CPUs only"."""
    return "GPUs" if a.steps.height and (a.steps["device"] >= 0).any() else "CPUs only"


@click.command()
@click.argument("base")
@click.argument("new")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text", show_default=True)
@click.option("-o", "--output", type=FilePath(dir_okay=False), help="Write the comparison to this file.")
@click.option(
    "--fail-if-slower",
    type=Finite(min=0),
    metavar="PCT",
    help=f"Exit {EXIT_FINDING} when NEW's median step is more than PCT percent slower than BASE's.",
)
@click.option("--step-regex", metavar="REGEX", help="Step markers other than ProfilerStep#N (both runs).")
@click.option("--allow-mixed", is_flag=True, help="Analyse a side whose files are not one run anyway.")
@click.option(
    "--jobs",
    "-j",
    type=Jobs(),
    default=0,
    envvar="TRACEDIAG_JOBS",
    help="Processes reading files, this one included: 0 automatic, N >= 1.",
)
@allow_missing_option
def compare(
    base: str,
    new: str,
    fmt: str,
    output: str | None,
    fail_if_slower: float | None,
    step_regex: str | None,
    allow_mixed: bool,
    jobs: int,
    allow_missing: bool,
) -> None:
    """Compare two runs (trace files, directories, or saved `analyze --format json` output)."""
    (a, a_failed), (b, b_failed) = _side(base, step_regex, jobs, allow_mixed), _side(new, step_regex, jobs, allow_mixed)
    sides = a, b
    kinds = [_hardware(a) for a in sides]
    if kinds[0] != kinds[1]:
        click.echo(
            f"warning: {shown(base)} ran on {kinds[0]} and {shown(new)} on {kinds[1]}: the deltas compare different "
            "hardware, not a change to one job",
            err=True,
        )
    result = _compare(*sides)
    if fmt == "json":
        text = orjson.dumps(result.to_dict()).decode()
    elif fmt == "html":
        text = render_compare_html(result)
    else:
        text = render_compare_text(result)
    if output:
        try:
            refuse_inputs(output, resolve_paths([base, new]), "-o")
            write_atomic(output, (text + "\n").encode())
        except TracediagError as e:
            raise InputError(str(e)) from None
        click.echo(f"wrote {shown(output)}", err=True)
    else:
        click.echo(text)
    if fail_if_slower is not None and result.step_time_delta_pct * 100 > fail_if_slower:
        click.echo(
            f"new median step is {result.step_time_delta_pct:+.1%} against base (limit +{fail_if_slower:g}%)", err=True
        )
        raise SystemExit(EXIT_FINDING)
    exit_if_missing(a_failed + b_failed, allow_missing)
