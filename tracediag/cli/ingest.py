"""`tracediag ingest`: read every rank's trace into one event table (Parquet) and summarise it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
import polars as pl

from tracediag.cli.common import FilePath, InputError
from tracediag.cli.execute_options import executor_options, refuse_without_executor, storage_options
from tracediag.cli.traces import exit_if_missing, load_traces, trace_options
from tracediag.derive.steps import find_markers
from tracediag.errors import NoStepsError, TracediagError, capped, one_line, shown
from tracediag.units import NS_PER_MS, format_ms

if TYPE_CHECKING:
    from tracediag.run import Run


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
        kinds = ev.group_by("kind").len().sort(["len", pl.col("kind").cast(pl.String)], descending=[True, False])
        lines.append("kinds   " + ", ".join(f"{k} {n:,}" for k, n in kinds.iter_rows()))
        try:
            nums = find_markers(ev)["step"].unique().sort().to_list()  # the steps `analyze` finds
        except NoStepsError as e:  # markers `analyze` will refuse: the table is read, the reason said
            lines.append(f"steps   none: {e}")
            nums = []
        if nums:
            lines.append(f"steps   {len(nums)} ({nums[0]}..{nums[-1]})")
        span_ns = ev.group_by("rank").agg(span=(pl.col("ts") + pl.col("dur")).max() - pl.col("ts").min())["span"]
        lines.append(f"span    {format_ms(span_ns.max() / NS_PER_MS, 3)} (longest rank)")
    if meta.skipped:
        lines.append("skipped " + ", ".join(f"{r} {n:,}" for r, n in meta.skipped.items()))
    # the first `SHOWN_LINES`, then one line counting the rest by problem (thousands of windows cut short are
    # not thousands of lines; `run.meta.files` keeps every one)
    said = [f"{shown(f.path)}: {one_line(w)}" for f in meta.files for w in f.warnings]
    lines += [f"warning {line}" for line in capped(said, noun="file warning")]
    return "\n".join(lines)


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--output", type=FilePath(dir_okay=False), help="Write the event table to this Parquet file.")
@trace_options
@click.option("--step-regex", metavar="REGEX", help="With --executor: step markers for the per-rank summaries.")
@click.option("--allow-mixed", is_flag=True, help="Read files that are not ranks of one run into one table anyway.")
@executor_options
def ingest(
    paths: tuple[str, ...],
    output: str | None,
    jobs: int,
    rank_from_filename: str | None,
    rank_map: tuple[str, ...],
    step_regex: str | None,
    comm_kernel: str | None,
    allow_mixed: bool,
    **ex_kw: Any,
) -> None:
    """Read trace files (files, globs or directories) into one event table.

    With --executor, each rank is read where the workers are and written to --out as its own event
    table plus its summaries, for `analyze --executor ... --out DIR --resume` to reuse.
    """
    refuse_without_executor(ex_kw)
    if ex_kw["executor"]:
        from tracediag.cli.execute_ingest import ingest_ranks

        ingest_ranks(
            paths,
            output,
            step_regex,
            ex_kw,
            jobs=jobs,
            rank_from_filename=rank_from_filename,
            rank_map=rank_map,
            comm_kernel=comm_kernel,
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
    if not allow_mixed:  # the run sanity `analyze` applies: two unrelated runs are not one table
        from tracediag.same_run import check_same_run

        try:
            check_same_run(run)
        except TracediagError as e:
            msg = str(e).replace("to analyse each file on its own", "to read them into one table anyway")
            raise InputError(msg) from None
    if output:
        try:
            run.save(output)
        except TracediagError as e:
            raise InputError(str(e)) from None
    click.echo(summary(run))
    if output:
        click.echo(f"wrote   {shown(output)}")
    exit_if_missing(run.meta.errors, ex_kw["allow_missing"])
