"""`tracediag ingest`: read every rank's trace into one event table (Parquet) and summarise it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import polars as pl

from tracediag.cli.common import InputError
from tracediag.cli.execute_options import executor_options, storage_options
from tracediag.derive.steps import find_markers
from tracediag.errors import TracediagError, one_line, shown
from tracediag.output import refuse_inputs
from tracediag.run import Run, load, resolve_paths
from tracediag.schema import MAX_RANK


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
        type=click.IntRange(min=0),
        default=0,
        envvar="TRACEDIAG_JOBS",
        show_default="one per 384 MB of input, at most one per CPU; with --executor one per CPU",
        help="Processes reading files in parallel, this one included (at most one per CPU and one per file).",
    )(f)
    return f


def parse_rank_map(items: tuple[str, ...]) -> dict[str, int]:
    """`FILE=N` items to a mapping; N is a whole number (ASCII digits) in the `rank` column's range."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        value = value.strip()
        if not sep or not name or not (value.isascii() and value.isdigit()) or int(value) > MAX_RANK:
            raise click.BadParameter(f"{item!r} is not FILE=N with N in 0..{MAX_RANK:,}", param_hint="--rank")
        out[name] = int(value)
    return out


def refuse_comm_kernel_with_executor(comm_kernel: str | None) -> None:
    """--comm-kernel relabels the loaded events; the summaries of --executor are made on the workers."""
    if comm_kernel is not None:
        raise InputError("--comm-kernel is not supported with --executor yet: load the run whole (no --executor)")


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
    try:
        files = resolve_paths(paths, storage_options)
        inputs = [*files, *(p for p in more_inputs if p is not None)]
        for option, out in (outputs or {}).items():
            if out is not None:
                refuse_inputs(out, inputs, option)
        mapping = parse_rank_map(rank_map)
        if sys.stderr.isatty() and len(files) > 1:
            with click.progressbar(length=len(files), label="reading", file=sys.stderr) as bar:
                run = load(
                    paths,
                    jobs=jobs,
                    rank_from_filename=rank_from_filename,
                    rank_map=mapping,
                    on_file_done=lambda _p: bar.update(1),
                    storage_options=storage_options,
                    comm_kernel=comm_kernel,
                )
        else:
            run = load(
                paths,
                jobs=jobs,
                rank_from_filename=rank_from_filename,
                rank_map=mapping,
                storage_options=storage_options,
                comm_kernel=comm_kernel,
            )
    except TracediagError as e:
        raise InputError(str(e).replace("\n", "\nError: ")) from None
    for line in run.meta.errors:
        click.echo(f"Error: {line}", err=True)
    return run


def summary(run: Run) -> str:
    """A one-screen summary: ranks, events, steps, time span, skipped by reason, warnings."""
    ev, meta = run.events, run.meta
    n_files = sum(1 + len(f.windows) for f in meta.files)
    lines = [f"files   {n_files} read" + (f", {len(meta.errors)} failed" if meta.errors else "")]
    if n_files > len(meta.files):
        lines[0] += f" ({n_files - len(meta.files)} more profiler windows of a rank, joined to its timeline)"
    if meta.ignored:
        lines[0] += f", {len(meta.ignored)} in the directories ignored (not traces: {meta.ignored[0]}"
        lines[0] += f" and {len(meta.ignored) - 1} more)" if len(meta.ignored) > 1 else ")"
    ranks = meta.ranks
    rank_text = f"{ranks[0]}..{ranks[-1]}" if len(ranks) > 3 else ", ".join(map(str, ranks))
    lines.append(f"ranks   {len(ranks)} ({rank_text}) of world size {meta.world_size}")
    formats = sorted({f.format for f in meta.files})
    lines.append(f"format  {', '.join(formats)}; time base: {', '.join(sorted({f.time_base for f in meta.files}))}")
    lines.append(f"events  {meta.events_in:,} in -> {ev.height:,} rows + {sum(meta.skipped.values()):,} skipped")
    if ev.height:
        kinds = ev.group_by("kind").len().sort("len", descending=True)
        lines.append("kinds   " + ", ".join(f"{k} {n:,}" for k, n in kinds.iter_rows()))
        nums = find_markers(ev)["step"].unique().sort().to_list()  # the steps `analyze` finds
        if nums:
            lines.append(f"steps   {len(nums)} ({nums[0]}..{nums[-1]})")
        span_ns = ev.group_by("rank").agg(span=(pl.col("ts") + pl.col("dur")).max() - pl.col("ts").min())["span"]
        lines.append(f"span    {span_ns.max() / 1e6:,.3f} ms (longest rank)")
    if meta.skipped:
        lines.append("skipped " + ", ".join(f"{r} {n:,}" for r, n in meta.skipped.items()))
    for f in meta.files:
        for w in f.warnings:
            lines.append(f"warning {shown(f.path)}: {one_line(w)}")
    return "\n".join(lines)


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the event table to this Parquet file.")
@trace_options
@click.option("--step-regex", metavar="REGEX", help="With --executor: step markers for the per-rank summaries.")
@executor_options
def ingest(
    paths: tuple[str, ...],
    output: str | None,
    jobs: int,
    rank_from_filename: str | None,
    rank_map: tuple[str, ...],
    step_regex: str | None,
    comm_kernel: str | None,
    **ex_kw: Any,
) -> None:
    """Read trace files (files, globs or directories) into one event table.

    With --executor, each rank is read where the workers are and written to --out as its own event
    table plus its summaries, for `analyze --executor ... --out DIR --resume` to reuse.
    """
    if ex_kw["executor"]:
        from tracediag.cli.execute_ingest import ingest_ranks

        refuse_comm_kernel_with_executor(comm_kernel)
        ingest_ranks(
            paths, output, step_regex, ex_kw, jobs=jobs, rank_from_filename=rank_from_filename, rank_map=rank_map
        )
        return
    run = load_traces(
        paths,
        jobs,
        rank_from_filename,
        rank_map,
        {"-o": output},
        storage_options=storage_options(ex_kw["storage_options"]),
        comm_kernel=comm_kernel,
    )
    if output:
        try:
            run.save(output)
        except TracediagError as e:
            raise InputError(str(e)) from None
    click.echo(summary(run))
    if output:
        click.echo(f"wrote   {shown(output)}")
    if run.meta.errors:
        sys.exit(InputError.exit_code)
