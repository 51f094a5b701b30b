"""`tracediag ingest --executor`: every rank's events and summaries written where the workers are."""

from __future__ import annotations

from typing import Any

import polars as pl

from tracediag.cli.common import InputError
from tracediag.cli.execute_options import refuse_overwrite, report_failed, run_summaries, summarize_kw


def ingest_ranks(
    paths: tuple[str, ...],
    output: str | None,
    step_regex: str | None,
    ex_kw: dict[str, Any],
    *,
    jobs: int,
    rank_from_filename: str | None,
    rank_map: tuple[str, ...],
    comm_kernel: str | None = None,
) -> None:
    """Summarise each rank into --out (events kept), print a summary from the manifest, exit 2 on failed files."""
    import click

    from tracediag.execute.driver import summarize

    if output:
        msg = "--output writes one Parquet of all events; with --executor use --out DIR (one per rank)"
        raise InputError(msg)
    if not ex_kw["out_dir"]:
        msg = "ingest --executor needs --out DIR|URL for the per-rank tables"
        raise InputError(msg)
    refuse_overwrite(paths, {}, (), ex_kw)
    kw = summarize_kw(ex_kw, jobs=jobs, rank_from_filename=rank_from_filename, rank_map=rank_map)
    kw.update(keep_events=True, step_regex=step_regex, comm_kernel=comm_kernel)
    s = run_summaries(summarize, paths, out=ex_kw["out_dir"], **kw)
    ok = s.manifest.filter("ok")
    ranks = s.ranks
    rank_text = f"{ranks[0]}..{ranks[-1]}" if len(ranks) > 3 else ", ".join(map(str, ranks))
    lines = [
        f"files   {ok.height} read"
        + (f", {len(s.meta.errors)} failed" if s.meta.errors else "")
        + (f", {len(s.meta.ignored)} in the directories ignored (not traces)" if s.meta.ignored else ""),
        f"ranks   {len(ranks)} ({rank_text}) of world size {s.meta.world_size}",
        f"events  {s.meta.events_in:,} in -> {ok['events'].sum():,} rows + {sum(s.meta.skipped.values()):,} skipped",
        f"tasks   {ok['seconds'].sum():,.1f} s on workers; retried {ok.filter(pl.col('attempt') > 1).height}",
        f"wrote   {ex_kw['out_dir']} (manifest.parquet, events/, ranks/)",
    ]
    click.echo("\n".join(lines))
    report_failed(s.meta.errors, ex_kw["allow_missing"])
