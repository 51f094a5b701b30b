"""Reading the traces a command names: the options every such command shares (`trace_options`) and the
one load that turns a bad input into one line (`load_traces`)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from tracediag.cli.common import InputError, Jobs
from tracediag.errors import TracediagError, capped
from tracediag.output import refuse_inputs

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from tracediag.run import Run, RunMeta


def trace_options(f):
    """The options every command that reads traces shares."""
    f = click.option(
        "--rank",
        "rank_map",
        multiple=True,
        metavar="FILE=N",
        help="Assign rank N to FILE (path or base name); repeatable.",
    )(f)
    f = click.option(
        "--rank-from-filename",
        metavar="REGEX",
        help=r"Take each file's rank from its name: the regex's first group, e.g. 'rank(\d+)'.",
    )(f)
    f = click.option(
        "--comm-kernel",
        metavar="REGEX",
        help="Kernels whose name this finds are communication too (beyond NCCL, DeepEP, NVSHMEM, custom "
        "all-reduce, userbuffers), e.g. 'my_a2a_kernel'.",
    )(f)
    f = click.option(
        "--jobs",
        "-j",
        type=Jobs(),
        default=0,
        envvar="TRACEDIAG_JOBS",
        show_default="one per 384 MB of input, at most one per CPU; with --executor one per CPU",
        help="Processes reading files in parallel, this one included: 0 automatic, N >= 1 (at most one per CPU and "
        "one per file).",
    )(f)
    return f


def parse_rank_map(items: tuple[str, ...]) -> dict[str, int]:
    """`FILE=N` items to a mapping; N is a whole number (ASCII digits) in the `rank` column's range."""
    from tracediag.schema import MAX_RANK

    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        value = value.strip()
        if not sep or not name or not (value.isascii() and value.isdigit()) or int(value) > MAX_RANK:
            msg = f"{item!r} is not FILE=N with N in 0..{MAX_RANK:,}"
            raise click.BadParameter(msg, param_hint="--rank")
        out[name] = int(value)
    return out


@contextmanager
def reading_progress(n_files: int) -> Iterator[Callable[[str], None] | None]:
    """A progress bar on stderr while `n_files` files are read (on a terminal, for more than one file):
    yields the `on_file_done` callback that advances it, or None."""
    if sys.stderr.isatty() and n_files > 1:
        with click.progressbar(length=n_files, label="reading", file=sys.stderr) as bar:
            yield lambda _path: bar.update(1)
    else:
        yield None


def load_traces(
    paths: tuple[str, ...],
    jobs: int,
    rank_from_filename: str | None,
    rank_map: tuple[str, ...],
    outputs: dict[str, str | Path | None] | None = None,
    more_inputs: tuple[str | Path | None, ...] = (),
    storage_options: dict[str, str] | None = None,
    comm_kernel: str | None = None,
) -> Run:
    """Load traces for a command: progress on a terminal, bad files reported one line each.

    `outputs` (option -> path) are refused when they name an input: a trace, or one of `more_inputs`.
    `storage_options` apply to input URLs (`run.load`).
    """
    from tracediag.run import load, resolve_paths

    try:
        files = resolve_paths(paths, storage_options)
        inputs = [*files, *(p for p in more_inputs if p is not None)]
        for option, out in (outputs or {}).items():
            if out is not None:
                refuse_inputs(out, inputs, option)
        mapping = parse_rank_map(rank_map)
        with reading_progress(len(files)) as on_file_done:
            run = load(
                paths,
                jobs=jobs,
                rank_from_filename=rank_from_filename,
                rank_map=mapping,
                on_file_done=on_file_done,
                storage_options=storage_options,
                comm_kernel=comm_kernel,
            )
    except TracediagError as e:
        raise InputError(str(e).replace("\n", "\nError: ")) from None
    report_read_errors(run.meta)
    return run


def report_read_errors(meta: RunMeta) -> None:
    """Each file that could not be read, one ``Error:`` line on stderr (the others were read)."""
    for line in capped(meta.errors):
        click.echo(f"Error: {line}", err=True)


ALLOW_MISSING_HELP = (
    "Exit 0 although some trace files could not be read (each is named on stderr, its rank reported missing); "
    "without it such a run exits 2 once the output is out."
)


def allow_missing_option(f):
    """`--allow-missing`, for a command that goes on with the traces it could read."""
    return click.option("--allow-missing", is_flag=True, help=ALLOW_MISSING_HELP)(f)


def exit_if_missing(errors: tuple[str, ...], allow_missing: bool) -> None:
    """Exit 2 when some trace files could not be read, unless `--allow-missing`: one rule for every
    command and path (called after the output is written). A report on an incomplete rank set is
    written, but passing a CI gate on it would be a wrong answer nobody asked for."""
    if errors and not allow_missing:
        sys.exit(InputError.exit_code)
